-- The runs' leases: the fair claim that grants them, and the statements that
-- renew, release and end them.
--
-- The fair claim is one call of agentrun_claim() (run_claim below;
-- control_plane/store/lease.py calls it), a function of the schema:
-- control_plane/store/sql/schema.sql, section 7 "The claim", has it with its
-- argument beside it: its parts (turns taken on the coordinator, a lease step
-- per shard, the turns marked and raised), why caps hold with any number of claimers, why raising
-- next_wake_at is safe, how the running counts move, and what others_due says.
--
-- The two arguments below are about the leases themselves: release on break
-- (run_release_on_break, below) and renewing on commit (the commits of
-- steps.sql).

-- Release on break: why a broken stream's runs may be taken over within
-- seconds (run_release_on_break) without any tool request still leaving from
-- the old holder, and why fencing does not change.
--
-- The promise. Whatever the old holder does, no tool request (or other
-- external action) of a run starts after another executor may have claimed
-- it. Commits need no such promise: every one is fenced by the epoch in its
-- own transaction, and nothing here touches epochs.
--
-- The two clocks. The executor (executor/horizon.py) starts a tool request
-- only while, on its own monotonic clock, now < s + H, where s is the *send*
-- time of the last Ping that this stream acknowledged (a Pong), and only for
-- a lease granted by an Assignment on this same stream. The control plane
-- (control_plane/dispatch/liveness.py) notes r, the time it *received* the
-- last Ping, before it answers it; when the stream ends for any reason
-- (closed, reset, or silent for AGENTRUN_STREAM_DEAD_SECONDS) it writes, for
-- the leases the stream held, wake_at = least(wake_at, now() + (r + H + m
-- - t)), t being its own monotonic time then; the claim takes a lapsed lease
-- only once wake_at <= now().
--
-- Why that holds. Let s_k be the send time of the last Ping the executor saw
-- acknowledged. The control plane answered it, so it received it at r_k >=
-- s_k, and r >= r_k (it notes every Ping before answering, and answers none
-- after the stream ends). The executor's last possible start is s_k + H on
-- its clock, at most s_k + H(1 + p) real time for a clock rate error p. The
-- release is at least r + (H + m)(1 - p) real time: the remaining time is
-- computed before the statement runs, and any delay in running it only moves
-- wake_at later. So the release follows the last start by at least m - 2pH
-- (for small p), which is positive by far for any sane clock (p <= 1e-3 and
-- H = 1.5 s make 2pH = 3 ms; the margin m defaults to 0.5 s, at least 0.1 s).
-- The rest of m covers the few instructions between the executor's last
-- check (executor/http_session.py, right before the request is written)
-- and the request's first byte. The horizon is counted from the send time
-- the way HeldLease.renew counts the lease, so it never overestimates; the
-- lease's own safety margin still applies on top (least(): a release never
-- keeps a run longer than its lease did).
--
-- Reconnects. A stream's acknowledgements vouch only for leases granted on
-- that stream: the old stream's release may come at any time after its own
-- r + H + m, whatever a new stream acknowledges. So a lease carried over a
-- reconnect (Hello.held) stays the executor's own while its epoch matches:
-- it heartbeats, and its commits land, but it never starts a tool request
-- again. A run that needs one hands itself back (a fenced handoff park) and
-- is claimed afresh at a new epoch, by whichever executor; a call already
-- started is named in that park as never sent, so the next holder sends it
-- under its key instead of resolving it as an unknown. (Letting the new
-- stream vouch for the old lease instead would need the old stream's
-- release fenced by a stream id on the row: it matches by owner and epoch,
-- which a reconnect keeps. A handoff costs one claim.) An executor that
-- never pings (an older release) is never released early; an executor told
-- no horizon (AGENTRUN_SEND_HORIZON_SECONDS=0, or an older control plane)
-- relies on its lease alone.
--
-- What is left, honestly. The same residual the lease margin has always
-- had: a process paused (SIGSTOP, a long GC or scheduling stall) after its
-- last check and before the request's bytes leave may wake after the run
-- was taken over and send once. The pause has to outlast what is left of
-- H + m after the check (at least m, 0.5 s by default); with the lease alone
-- it would have to outlast what is left of the lease (at least its safety
-- margin, 6 s by default). It is the same kind of window, smaller in time,
-- and the commit that follows is still fenced. A request that must first open a
-- new connection to its provider spends its connect time in that window
-- too. Like every lease, the release trusts the database's clock not to
-- jump forward (a step of it moves every wake_at alike).

-- Renewing on commit: why most commits may leave the lease alone.
--
-- A commit that keeps the lease (run_commit, run_commit_many in steps.sql)
-- renews it (wake_at = now() + lease) only once half of it or less is left,
-- for an executor whose Hello set reads_commit_renewal; otherwise it leaves
-- wake_at as it is. Of what such a commit writes, only wake_at is indexed
-- (runs_leases, runs_due, runs_due_by_priority: HOT goes by the columns an
-- index names, whatever its predicate), so the update can then be HOT and
-- write no index entry (the first commit after a connection wait also clears
-- waiting_connection_id, once). CommitResult.lease_expire_time is set only on
-- a renewal.
--
-- Why that holds. The executor's lease (HeldLease.valid_until) grows only on
-- a renewal the control plane reported: a heartbeat it renewed, or a commit
-- whose result carries lease_expire_time, each counted from the executor's
-- send time, which precedes the statement that set wake_at. A commit that
-- did not renew changes neither view, so the executor never believes a lease
-- longer than the one recorded; at worst it stops itself earlier than it had
-- to. The claim takes over only by wake_at, which a skipped renewal leaves
-- earlier, never later, and a release on break still takes the least().
-- Fencing does not depend on it: the epoch check runs either way, and the
-- renewal is decided on the row that check locked. An older executor counts every
-- landed commit as a renewal; its Hello lacks the flag (read before any of
-- the stream's commits; a commit sent again after a reconnect comes from
-- the same executor), so each of its commits renews; an older
-- control plane ignores the flag, renews on every commit and sets
-- lease_expire_time each time, which is then true. A retried commit
-- acknowledged as a duplicate reports no renewal, whatever its first try
-- did. The half is not needed for safety, only for liveness: heartbeats
-- renew every third of a lease by default, so commits seldom renew; should
-- heartbeats stall, a commit renews while the executor may still have more
-- than its safety margin (a fifth) left: a run committing more often than
-- every 0.3 leases (a half less the margin) keeps its lease without them.

-- name: run_claim :many
-- The fair claim in one call of agentrun_claim() (schema.sql, section 7,
-- says how and why), one statement in its own transaction, one round trip.
--
-- Leases up to cardinality($1) runs, run i to owner $1[i]: lapsed leases
-- first (they hold their slot already), then the due runs of the workspaces
-- whose turn it is, one per workspace per round, within the room of the
-- workspace and of each agent. Within a workspace, highest priority first,
-- then oldest due: priority reorders a workspace's own share and never gives
-- it a turn out of order. Marks the workspaces served; says of each run
-- whether it was taken over (its lease had lapsed), and whether its
-- workspace is left with a due run (keeps_due: one it read and did not
-- pick; its next_wake_at is then not raised). Database clock unless $3
-- fixes it. Only workspaces in the executors' scope $4 (NULL: all): a scoped
-- pool never leases another tenant's run. Only runs whose agent version's
-- tools are all among $5 (a JSON array of the tools the owners carry; NULL:
-- any) are taken, lapsed or fresh: an executor is never handed a run it
-- could not finish. A workspace with due runs none of which these owners can
-- run goes to the back of the line like one at its caps (it had nothing this
-- claim could take); that costs it its place only against the other
-- workspaces, and keeps it from blocking a turn slot of every claim.
-- Releases: with $6 (the releases these owners continue, their own $7 among
-- them; NULL: releases ignored) a run already on a release is taken only if
-- it is one of $6, and a run on none only if $7 is
-- the newest release with an executor seen within $8 seconds that is not
-- draining (with $9, only among releases promoted or past a canary); the
-- claim records $7 on the runs it takes first. A last row, its run NULL and
-- others_due true, says the claim took fewer runs than it had owners while a
-- workspace whose turn it would have taken was held by another claimer and
-- still has due runs with room: the caller may claim again soon.
-- metered: the run's workspace has a credit account (control_plane/credits/
-- claims.py reserves its chunk before the run is assigned), read by the lease
-- step on the run's shard after its lease: a grant landing later meters the
-- run from its next claim on.
SELECT (c.run).*, c.held_seconds, c.taken_over, c.keeps_due, c.others_due, c.metered
FROM agentrun_claim($1::text[], $2::float8, $3::timestamptz, $4::text[], $5::jsonb,
                    $6::text[], $7::text, $8::float8, $9::boolean) c;

-- name: run_queue_position :one
-- Where a queued or waiting run stands: its workspace's and agent's running
-- counts and caps, and how many runs of the workspace the claim takes before
-- it: those of higher priority due by the time it is, and those of its own
-- priority with an earlier wake time (runs of another agent at its cap are
-- passed over, so they are not counted). No row for a run that is not
-- waiting its turn. The running counts are read by subqueries filtered by the
-- workspace, not by workspace_running()/agent_running() over a column: on Citus
-- those would run on the shard, where a function reading a distributed table is
-- refused.
WITH me AS (
    SELECT r.workspace_id, r.run_id, r.agent_id, r.wake_at, r.priority,
           r.wake_at <= coalesce($3::timestamptz, now()) AS due,
           greatest(r.wake_at, coalesce($3::timestamptz, now())) AS due_by
    FROM runs r
    WHERE r.workspace_id = $1 AND r.run_id = $2
      AND r.status IN ('queued', 'waiting') AND r.wake_at IS NOT NULL
)
SELECT me.due,
       (SELECT coalesce(sum(c.n), 0)::bigint FROM workspace_running_counts c
        WHERE c.workspace_id = $1) AS workspace_running,
       w.max_concurrency AS workspace_max_concurrency,
       (SELECT coalesce(sum(c.n), 0)::bigint FROM agent_running_counts c
        WHERE c.workspace_id = $1 AND c.agent_id = a.agent_id) AS agent_running,
       a.max_concurrency AS agent_max_concurrency,
       (SELECT coalesce(sum(ahead.n + higher.n), 0)
        FROM agents o
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM runs x
            WHERE x.workspace_id = $1 AND x.workspace_id = o.workspace_id AND x.agent_id = o.agent_id
              AND x.status IN ('queued', 'waiting') AND x.priority = me.priority
              AND x.wake_at <= me.wake_at
              AND (x.wake_at < me.wake_at OR x.run_id < me.run_id)
        ) ahead
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM runs x
            WHERE x.workspace_id = $1 AND x.workspace_id = o.workspace_id AND x.agent_id = o.agent_id
              AND x.status IN ('queued', 'waiting') AND x.priority > me.priority
              AND x.wake_at <= me.due_by
        ) higher
        WHERE o.workspace_id = $1 AND o.workspace_id = me.workspace_id
          AND (o.agent_id = me.agent_id OR o.max_concurrency IS NULL
               OR (SELECT coalesce(sum(c.n), 0) FROM agent_running_counts c
                   WHERE c.workspace_id = $1 AND c.agent_id = o.agent_id)
                  < o.max_concurrency))::bigint
       AS runs_ahead
FROM me
JOIN workspaces w ON w.workspace_id = $1 AND w.workspace_id = me.workspace_id
JOIN agents a ON a.workspace_id = $1 AND a.workspace_id = me.workspace_id
             AND a.agent_id = me.agent_id;

-- name: run_heartbeat :many
-- Renew the leases an executor holds in workspace $2 (runs $3 at epochs $4), in one
-- statement, while the run is within its limits: active time (the holds so far,
-- this one included) under its deadline, and its max age not passed. A lease
-- missing from the result was lost (taken, cancelled, finished) or is past a
-- limit. Database clock unless $6 fixes it. One workspace per statement: on Citus
-- it is then one shard (a lock across shards is refused); the store sends one per
-- workspace the executor holds runs of. The rows are locked first, in run_id order
-- as run_commit_many locks them: the executor's grouped commits touch the same
-- rows, and in any other order the two could deadlock. `paused`: a PauseRun the
-- holder is asked (again) to act on, whichever replica took it. Each row names its
-- lease by `i`, its position (from 1) in $3/$4, and nothing else the caller sent: an
-- executor's beat carries every run it holds, thousands, and the caller matches
-- the renewed ones to its own list by position instead of decoding and hashing
-- each one's workspace, run and epoch again.
WITH clock AS MATERIALIZED (
    SELECT (SELECT coalesce($6::timestamptz, now())) AS now
), locked AS (
    SELECT r.run_id, h.i FROM runs r
    JOIN unnest($3::uuid[], $4::bigint[]) WITH ORDINALITY AS h(run_id, epoch, i)
      ON r.run_id = h.run_id
    WHERE r.workspace_id = $2
      AND r.lease_epoch = h.epoch AND r.lease_owner = $1 AND r.status = 'running'
      AND r.active_seconds + run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock))
          < r.deadline_seconds
      AND (r.expires_at IS NULL OR r.expires_at > (SELECT now FROM clock))
    ORDER BY r.run_id
    FOR NO KEY UPDATE OF r
)
UPDATE runs r
SET wake_at = (SELECT coalesce($6::timestamptz, now()) + make_interval(secs => $5)),
    updated_at = now()
FROM locked l
WHERE r.workspace_id = $2 AND r.run_id = l.run_id
RETURNING l.i::int AS i, r.wake_at, r.paused;

-- name: run_fail_past_deadline :many
-- Fail held runs of workspace $1 (runs $2 at epochs $3) past a limit (the heartbeat
-- refused them): "deadline exceeded" once their active time reached the deadline,
-- "max age exceeded" once their max age passed. Database clock unless $4 fixes
-- it. One workspace, one shard on Citus, as run_heartbeat; the finish step's seq is
-- read in the statement (run_next_seq() inlined: on a shard, a function reading a
-- distributed table is refused).
WITH clock AS MATERIALIZED (
    SELECT (SELECT coalesce($4::timestamptz, now())) AS now
), past AS (
    SELECT r.workspace_id, r.run_id,
           CASE WHEN r.expires_at <= (SELECT now FROM clock) THEN 'max age exceeded'
                ELSE 'deadline exceeded' END AS error
    FROM runs r
    WHERE r.workspace_id = $1 AND r.run_id = ANY($2::uuid[])
      AND r.lease_epoch = ($3::bigint[])[array_position($2::uuid[], r.run_id)]
      AND r.status = 'running'
      AND (r.expires_at <= (SELECT now FROM clock)
           OR r.active_seconds + run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock))
              >= r.deadline_seconds)
    ORDER BY r.run_id  -- the order every multi-run statement locks in
    FOR NO KEY UPDATE OF r
), failed AS (
    UPDATE runs r SET status = 'failed', error = p.error, wake_at = NULL,
                      lease_owner = NULL, step_count = r.step_count + 1,
                      finished_at = (SELECT now FROM clock), updated_at = now()
    FROM past p
    WHERE r.workspace_id = $1 AND r.run_id = p.run_id
    RETURNING r.workspace_id, r.run_id, r.lease_epoch, r.error
), to_append AS (
    SELECT f.workspace_id, f.run_id,
           (SELECT coalesce(max(s.seq), -1) + 1 FROM steps s
            WHERE s.workspace_id = $1 AND s.run_id = f.run_id) AS seq,
           'finish' AS kind, f.lease_epoch AS epoch, NULL::int AS ref_seq,
           jsonb_build_object('status', 'failed', 'error', f.error) AS payload,
           now() AS created_at, NULL::text AS release
    FROM failed f
), {{steps_append}}
SELECT * FROM failed;

-- name: run_fail_held :one
-- Fail a run still held at this epoch with a reason ($4), its finish step
-- saying why: the control plane could not commit the holder's step. Nothing
-- when the run is not held at that epoch.
WITH failed AS (
    UPDATE runs SET status = 'failed', error = $4, wake_at = NULL, lease_owner = NULL,
                    step_count = step_count + 1, finished_at = now(), updated_at = now()
    WHERE workspace_id = $1 AND run_id = $2 AND lease_epoch = $3 AND status = 'running'
    RETURNING workspace_id, run_id, lease_epoch
), to_append AS (
    SELECT f.workspace_id, f.run_id, run_next_seq(f.workspace_id, f.run_id) AS seq,
           'finish' AS kind, f.lease_epoch AS epoch, NULL::int AS ref_seq,
           jsonb_build_object('status', 'failed', 'error', $4::text) AS payload,
           now() AS created_at, NULL::text AS release
    FROM failed f
), {{steps_append}}
SELECT * FROM failed;

-- name: runs_past_max_age_workspaces :many
-- Up to $1 workspaces with runs past their max age that nobody holds (queued,
-- parked, or with a lapsed lease), the longest overdue first: the max-age sweep's
-- first step. No lock: on Citus this reads every shard, which a locking read may
-- not. Database clock unless $2 fixes it.
SELECT r.workspace_id FROM runs r
WHERE r.expires_at IS NOT NULL AND r.expires_at <= coalesce($2::timestamptz, now())
  AND (r.status IN ('queued', 'waiting')
       OR (r.status = 'running' AND r.wake_at <= coalesce($2::timestamptz, now())))
GROUP BY r.workspace_id
ORDER BY min(r.expires_at)
LIMIT $1;

-- name: run_fail_past_max_age :many
-- Fail up to $1 runs of workspace $3 past their max age that nobody holds:
-- queued, parked (on a time or on an event that may never come), or with a lapsed
-- lease; rows another replica has locked are skipped. Held runs are the
-- heartbeat's (it refuses them). Database clock unless $2. One workspace: one
-- shard on Citus (runs_past_max_age_workspaces names them); the finish step's
-- seq is read in the statement, as run_fail_past_deadline's.
WITH clock AS MATERIALIZED (
    SELECT (SELECT coalesce($2::timestamptz, now())) AS now
), expired AS (
    SELECT r.workspace_id, r.run_id FROM runs r
    WHERE r.workspace_id = $3
      AND r.expires_at IS NOT NULL AND r.expires_at <= (SELECT now FROM clock)
      AND (r.status IN ('queued', 'waiting')
           OR (r.status = 'running' AND r.wake_at <= (SELECT now FROM clock)))
    ORDER BY r.expires_at
    LIMIT $1
    FOR NO KEY UPDATE SKIP LOCKED
), failed AS (
    UPDATE runs r SET status = 'failed', error = 'max age exceeded', wait_reason = NULL,
                      step_count = r.step_count + 1, wake_at = NULL, lease_owner = NULL,
                      finished_at = (SELECT now FROM clock), updated_at = now()
    FROM expired e
    WHERE r.workspace_id = $3 AND r.run_id = e.run_id
    RETURNING r.workspace_id, r.run_id, r.lease_epoch
), to_append AS (
    SELECT f.workspace_id, f.run_id,
           (SELECT coalesce(max(s.seq), -1) + 1 FROM steps s
            WHERE s.workspace_id = $3 AND s.run_id = f.run_id) AS seq,
           'finish' AS kind, f.lease_epoch AS epoch, NULL::int AS ref_seq,
           jsonb_build_object('status', 'failed', 'error', 'max age exceeded') AS payload,
           now() AS created_at, NULL::text AS release
    FROM failed f
), {{steps_append}}
SELECT workspace_id, run_id, lease_epoch FROM failed;

-- name: run_release_unassigned :exec
-- Give back a just-claimed run that could not be delivered (its executor
-- went away): runnable again now, under a new epoch at the next claim.
-- Database clock unless $4 fixes it. A run that never ran a step (only its
-- input) is on no release yet: the claim that could not deliver it set one.
UPDATE runs SET status = 'waiting', wait_reason = 'handoff', lease_owner = NULL,
                release = CASE WHEN step_count <= 1 THEN NULL ELSE release END,
                wake_at = (SELECT coalesce($4::timestamptz, now())), updated_at = now()
WHERE workspace_id = $1 AND run_id = $2 AND lease_epoch = $3 AND status = 'running';

-- name: run_release_on_break :many
-- An executor's stream ended (closed, reset, or declared silent): let the runs
-- it held there in workspace $2 (runs $3 at epochs $4) be taken over once $5
-- seconds have passed, or when their lease lapses if that is sooner ("Release on
-- break" at the top of this file says why this is safe). Epochs and fencing are
-- untouched. Database clock unless $6 fixes it. One workspace per statement (one
-- shard on Citus), locked in run_id order, as run_heartbeat says why.
WITH clock AS MATERIALIZED (
    SELECT (SELECT coalesce($6::timestamptz, now()) + make_interval(secs => $5)) AS release_at
), locked AS (
    SELECT r.run_id FROM runs r
    JOIN unnest($3::uuid[], $4::bigint[]) AS h(run_id, epoch) ON r.run_id = h.run_id
    WHERE r.workspace_id = $2
      AND r.lease_epoch = h.epoch AND r.lease_owner = $1 AND r.status = 'running'
      AND r.wake_at > (SELECT release_at FROM clock)
    ORDER BY r.run_id
    FOR NO KEY UPDATE OF r
)
UPDATE runs r SET wake_at = (SELECT release_at FROM clock), updated_at = now()
FROM locked l
WHERE r.workspace_id = $2 AND r.run_id = l.run_id
RETURNING r.workspace_id, r.run_id, r.lease_epoch, r.wake_at;
