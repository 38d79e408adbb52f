"""The executor: a stateless worker that carries agent runs forward, one committed step at a time.

An executor holds nothing that matters. The control plane owns every run in
Postgres; the executor holds a run only while it is working on it, under a
lease, and writes everything it learns back through one bidirectional gRPC
stream (`ExecutorService.Connect`) before it acts on it. Kill it at any
instant and another executor continues the run from its step log, without
asking the model again and without repeating a tool call.

Session. The executor opens the stream with `Hello` (its id, release,
capacity, and the leases it still holds after a reconnect), receives
`Welcome` (lease duration, heartbeat interval), and asks for work with
`Ready{slots}`: credits, one per free slot. The control plane claims due runs
and sends one `Assignment` per credit: the run, its agent version and its
whole step log. If the stream breaks, the executor keeps its runs,
reconnects with backoff, says `Hello` again with what it holds, and sends
again every commit whose reply it never saw; commits are idempotent by
(run, epoch, seq), so a commit sent twice lands once.

Leases and epochs. Every claim increments the run's `lease_epoch`, the
fencing token, and every commit and heartbeat carries it. The control plane
applies a commit only if the run is still running under that epoch, in the
same statement that locks the row; otherwise the answer is FENCED and the
executor stops the run and writes nothing more. One heartbeat renews every
held lease at once; a lease it refuses is lost the same way. The executor
also fences itself by its own clock: a lease is trusted until the send time
of the last acknowledged heartbeat or commit plus the lease duration, and a
run whose lease is within a safety margin of that is stopped at the next
heartbeat tick and never sends a tool request. So a paused or partitioned
executor cannot act after another has taken the run over.

Order of writes. The model's decision is committed before any tool it names
runs (with the `finish` step when it names none). Each tool call is committed
as `tool_started` before its request leaves, carrying the idempotency key
`<run_id>:<seq>`, and its `tool_result` after. Invalid calls (unknown tool,
tool not granted to the agent, arguments failing the schema) get an `error`
result and are never sent. When every call of the last decision has a
result, the model is asked again.

Resume. The step log is replayed into the conversation (recorded outputs
only) and the next action is the first step without a committed result. A
`tool_started` without a result is an unknown outcome, resolved by the
tool's idempotency class and never by guessing: reads are sent again;
`provider_key` writes are sent again with the same key; `none` writes are
not sent, and the result is recorded as `unknown`, visibly.

Waiting. A run that must wait lets go: `sleep` commits its `tool_started`
with a `park` step; a failing model provider parks the run with backoff; a
draining executor (SIGTERM) parks its runs as `handoff` at their next step
boundary. A parked run is a row with a wake time, not a coroutine.
"""

from telemetry import grpc_core

grpc_core.configure()  # before anything here loads grpc (telemetry/grpc_core.py says why)
