"""Credits: a workspace's balance, its append-only ledger, and the runs' reservations.

Every model call and tool call is priced when its step is committed
(control_plane/credits/pricing.py, a table of integer micro-credits) and summed on the run in
the commit's own statement. A workspace that has been granted credits has an account;
one that never was is unlimited (its runs are priced, never stopped).

A metered run pays out of reservations, never out of the balance directly:

* before its first step (at claim, control_plane/credits/claims.py) it reserves a chunk
  (the account's chunk_micros, or what is left of the balance);
* at each commit its cost is added; once it has spent all it reserved, the same commit
  reserves the next chunk, plus the overdraft of the step that crossed the line (a step
  already paid at the provider is always recorded);
* when the balance cannot cover anything ahead the run stops there, before its next
  step, by the account's policy: it parks (wait_reason "credits"; a grant wakes it) or
  fails with the reason;
* when it ends, by whatever path, a trigger settles it in the same transaction: its
  spend moves to the account's spent and the unused rest returns to the balance.

Each reservation is keyed (run_id, chunk), the chunk number read under the run row's
lock, and made only for a run held at the caller's epoch that owes one; the account
moves only by the ledger rows inserted. A claim or commit retried after a kill -9 of an
executor or of the control plane therefore reserves once (control_plane/store/sql/
credits.sql argues it in full). The account keeps granted = balance + reserved + spent
as a CHECK constraint.
"""
