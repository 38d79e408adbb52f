"""Triggers: what starts runs besides StartRun, and why each event starts at most one.

A trigger belongs to one agent and has one source:

* **webhook** – a sender POSTs signed deliveries to `/hooks/<workspace>/<trigger>`;
* **mail** – a mail provider POSTs each inbound message, signed the same way;
* **mail_push** – a provider POSTs "something changed" with only a history id,
  and the control plane fetches the changes (`push.py`);
* **schedule** – cron in a time zone, or an interval, fired by the scheduler
  loop (`control_plane/triggers/scheduler.py`).

The ingress does the minimum synchronously (senders retry when they do not
get a fast 2xx, Stripe for up to three days): verify the signature
(`signatures.py`, with two secrets active during a rotation), parse, apply
the cheap filters (`filters.py`), then record the event and its run in one
statement (`admission.py`) under unique (trigger_id, dedupe_key). The dedupe
key is whatever the source guarantees stable: the sender's delivery id, the
Message-ID, `agent_id:scheduled_for`. A redelivery, a second scheduler
replica firing the same slot, or a refetched message finds the first event
and its run: the reply is the same and nothing new runs. An event that a
filter stops (or inbound mail past the agent-to-agent chain depth, `mail.py`)
is recorded as filtered, with the reason, and costs no model call.
"""
