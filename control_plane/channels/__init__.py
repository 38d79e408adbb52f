"""Where a workspace's notifications go: Slack, e-mail over SMTP, signed webhooks (issue 43).

A workspace configures channels (ChannelService, `agentrun channels add`); each channel's
secret is sealed with the workspace's data key (crypto/envelope.py, purpose
`channel_secret`, bound to the channel's id). The outbox relay (approvals/relay.py)
delivers each row through them, at least once, each delivery carrying the row's stable id:

* a `chat` row through the workspace's `slack` channel: the Web API's chat.postMessage
  with answer buttons (the interactive clicks come back verified, http/approvals.py); the
  message's channel and ts are kept as the row's receipt, so a later chat.update can edit
  it (a cancelled run's approval says "cancelled");
* a `mail` row through its `email` channel: one message over SMTP (aiosmtplib) whose
  Message-ID is the row's id, so a redelivery is recognisable;
* every notification also becomes one `webhook` row per webhook channel, in the insert's
  statement (store/sql/outbox.sql): the row's id is the `webhook-id` of every attempt,
  signed afresh each time (Standard Webhooks), retried with the outbox's backoff until
  the receiver answers 2xx. A relay killed between the send and the mark sends again
  with the same id, which the receiver dedupes.

A workspace without a channel of a row's kind keeps the deployment's notifier
(AGENTRUN_NOTIFY_URL), as before.
"""
