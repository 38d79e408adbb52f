"""Human approvals: what you approve is what runs.

When the model picks a tool that needs approval, the executor commits the
proposed call (an `approval_requested` step), the approval row with the
SHA-256 of the exact arguments, one outbox row per notification and the run's
park (`waiting`, reason `approval`) in one transaction: a crash can neither
approve a call nobody was asked about nor ask about a call never recorded.

The outbox relay delivers the notifications afterwards, at least once, each
with a stable id; a link in a notification carries a fresh single-use token
(256 random bits) of which the database keeps only the hash. A GET shows the
exact arguments and never decides; a POST decides.

A decision is a compare-and-set (`... WHERE decision IS NULL`): two approvers
at once, or a click racing the expiry, resolve exactly once, and the loser is
told who won. The same transaction appends the `approval_decided` step and
sets the run's `wake_at = now()`. The executor then checks the arguments'
hash before it calls the tool. An edit replaces the arguments and is recorded
as the human's; a rejection is a tool result the model reads.

Expiry is policy, applied by the control plane while no executor holds the
run: reject, escalate to other approvers, or remind and extend. Nothing that
moves money is ever approved by anyone but a human.
"""
