-- The fair claim is one short transaction of up to four statements, in this
-- order, after claim_plan_generic (control_plane/store/lease.py runs it):
--
--   1. workspace_take_turns: lock the workspaces whose turn it is (least
--      recently served first, with due runs and room under their cap);
--   2. run_claim_due: lease lapsed runs, then those workspaces' oldest due
--      runs, round robin, within each workspace's and agent's room;
--   3. workspace_lock_for_raise + 4. workspace_raise_next_wake: for the
--      workspaces the claim may have emptied, recompute next_wake_at (none
--      when step 2 saw a due run it left in each: keeps_due).
--
-- Step 2 reads each agent's share of the batch first (the batch over the
-- workspaces in turn, and one more), and up to the whole batch only if that
-- falls short; its picks are the same either way (see `short` below).
--
-- Why caps hold with any number of claimers. A workspace's running count
-- only grows in step 2, under the row lock taken in step 1 and kept until
-- commit; step 2 is a new statement, so its snapshot sees every claim that
-- held that lock before. Other claimers skip the locked rows (SKIP LOCKED)
-- and never wait. Counts only shrink elsewhere (commits, cancels), which can
-- only make a claim more careful than it needs to be, never less.
--
-- Raising next_wake_at. Admissions and wake-ups lower it while holding KEY
-- SHARE on the workspace row until they commit (0003_fairness.sql), which
-- step 1's FOR NO KEY UPDATE does not conflict with: a 50k import never
-- holds claims up. Raising it is only safe with no such writer in flight, so
-- step 3 upgrades to FOR UPDATE (SKIP LOCKED: if a writer is in flight, the
-- raise waits for a later claim), and step 4, a new statement, then sees
-- every run those writers added; writers that come later wait for the claim
-- to commit and lower the raised value again.

-- Release on break: why a broken stream's runs may be taken over within
-- seconds (run_release_on_break) without any tool request still leaving from
-- the old holder, and why fencing is unchanged.
--
-- The promise. Whatever the old holder does, no tool request (or other
-- external action) of a run starts after another executor may have claimed
-- it. Commits need no such promise: every one is fenced by the epoch in the
-- same transaction as before, and nothing here touches epochs.
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
-- check (executor/tools/http_tool.py, right before the request is written)
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
-- is claimed afresh at a new epoch, by whichever executor. An executor that
-- never pings (an older release) is never released early; an executor told
-- no horizon (AGENTRUN_SEND_HORIZON_SECONDS=0, or an older control plane)
-- relies on its lease alone, as before.
--
-- What is left, honestly. The same residual the lease margin has always
-- had: a process paused (SIGSTOP, a long GC or scheduling stall) after its
-- last check and before the request's bytes leave may wake after the run
-- was taken over and send once. Before, the pause had to outlast what was
-- left of the lease after the check (at least its safety margin, 6 s by
-- default); now it has to outlast what is left of H + m (at least m, 0.5 s
-- by default). It is the same kind of window, smaller in time, and the
-- commit that follows is still fenced. A request that must first open a
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
-- Fencing is untouched: the epoch check is the one it was, and the renewal
-- is decided on the row that check locked. An older executor counts every
-- landed commit as a renewal; its Hello lacks the flag (read before any of
-- the stream's commits; a commit sent again after a reconnect comes from
-- the same executor), so each of its commits renews as before; an older
-- control plane ignores the flag, renews on every commit and sets
-- lease_expire_time each time, which is then true. A retried commit
-- acknowledged as a duplicate reports no renewal, whatever its first try
-- did. The half is not needed for safety, only for liveness: heartbeats
-- renew every third of a lease by default, so commits seldom renew; should
-- heartbeats stall, a commit renews while the executor may still have more
-- than its safety margin (a fifth) left: a run committing more often than
-- every 0.3 leases (a half less the margin) keeps its lease without them
-- (before, every 0.8 did).

-- name: claim_plan_generic :exec
-- Plan the claim's statements once per connection: their plans do not
-- depend on the arrays they are given (every step is an index probe), and
-- planning them afresh each time costs more than running them. A generic
-- plan cannot know how few runs a claim takes (its LIMITs are parameters):
-- with a million parked runs it may estimate thousands and hash the whole
-- runs table for the final UPDATE. Every join in these statements is meant
-- as a probe of a few rows, so the claim plans nested loops only. One
-- statement (set_config(..., true) is SET LOCAL), so that it prepares too.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true);

-- name: workspace_take_turns :many
-- Lock up to $1 workspaces whose turn it is, least recently served first,
-- with their room under the cap, among those the claiming executors' scope
-- $3 allows (NULL: every workspace). Database clock unless $2 fixes it.
-- The room is read before the lock is taken (the count is not on the locked
-- row): run_claim_due reads it again, in a new statement, and that is the one
-- the caps rely on.
SELECT w.workspace_id, w.max_concurrency - c.running AS room
FROM workspaces w
CROSS JOIN LATERAL (
    SELECT coalesce(sum(n), 0) AS running FROM workspace_running_counts c
    WHERE c.workspace_id = w.workspace_id) c
WHERE w.next_wake_at <= coalesce($2::timestamptz, now())
  AND c.running < w.max_concurrency
  AND ($3::text[] IS NULL OR w.workspace_id = ANY($3::text[]))
ORDER BY w.last_served_at, w.workspace_id
LIMIT $1
FOR NO KEY UPDATE OF w SKIP LOCKED;

-- name: run_claim_due :many
-- Lease up to cardinality($1) runs, run i to owner $1[i]: lapsed leases
-- first (they hold their slot already), then the due runs of the workspaces
-- in $4 (locked by workspace_take_turns, in turn order), one per workspace per
-- round, within the room of the workspace and of each agent. Within a
-- workspace, highest priority first, then oldest due: priority reorders a
-- workspace's own share and never gives it a turn out of order.
-- Marks the workspaces served; says of each run whether it was taken over
-- (its lease had lapsed), and whether its workspace is left with a due run
-- (keeps_due: one it read and did not pick). Database clock unless $3 fixes it. Lapsed
-- leases are taken only of workspaces in the executors' scope $5 (NULL: all):
-- a scoped pool never leases another tenant's run. Only runs whose agent
-- version's tools are all among $6 (a JSON array of the tools the owners
-- carry; NULL: any) are taken, lapsed or fresh: an executor is never handed
-- a run it could not finish. A workspace with due runs none of which these
-- owners can run goes to the back of the line like one at its caps (it had
-- nothing this claim could take); that costs it its place only against the
-- other workspaces, and keeps it from blocking a turn slot of every claim.
-- Releases (0020_releases.sql): with $7 (the releases these owners continue,
-- their own $8 among them; NULL: releases ignored) a run already on a release
-- is taken only if it is one of $7, and a run on none only if $8 is the
-- newest release with an executor seen within $9 seconds that is not
-- draining (with $10, only among releases promoted or past a canary); the
-- claim records $8 on the runs it takes first.
WITH clock AS MATERIALIZED (
    SELECT coalesce($3::timestamptz, now()) AS now
), routing AS MATERIALIZED (
    SELECT $7::text[] IS NULL AS any_release, $8::text IS NOT DISTINCT FROM (
        SELECT rl.release FROM releases rl
        WHERE rl.draining_since IS NULL
          AND (NOT $10::boolean OR rl.promoted_at IS NOT NULL OR rl.canary_passed_at IS NOT NULL)
          AND (rl.release = $8 OR EXISTS (  -- the claimers are connected themselves
            SELECT 1 FROM executor_tools e
            WHERE e.release = rl.release AND e.last_seen > now() - make_interval(secs => $9)))
        ORDER BY coalesce(rl.promoted_at, rl.first_seen_at) DESC, rl.release DESC
        LIMIT 1) AS takes_new
), lapsed AS (
    SELECT r.workspace_id, r.run_id FROM runs r
    WHERE r.status = 'running' AND r.wake_at <= (SELECT now FROM clock)
      AND ($5::text[] IS NULL OR r.workspace_id = ANY($5::text[]))
      AND ((SELECT any_release FROM routing) OR r.release = ANY($7::text[])
           OR (r.release IS NULL AND (SELECT takes_new FROM routing)))
      AND ($6::jsonb IS NULL OR EXISTS (
          SELECT 1 FROM agent_versions v
          WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
            AND v.version = r.agent_version
            AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $6::jsonb))
    ORDER BY r.wake_at
    LIMIT cardinality($1::text[])
    FOR UPDATE SKIP LOCKED
), turns AS (
    -- The running counts (0027_running_counts.sql), read by this statement's
    -- snapshot: it sees every claim that held the workspace's lock before.
    SELECT w.workspace_id, l.ord, w.max_concurrency - c.running AS room
    FROM unnest($4::text[]) WITH ORDINALITY AS l(workspace_id, ord)
    JOIN workspaces w USING (workspace_id)
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(n), 0) AS running FROM workspace_running_counts c
        WHERE c.workspace_id = w.workspace_id) c
    WHERE c.running < w.max_concurrency
), agent_rooms AS (
    SELECT t.workspace_id, t.ord, t.room, a.agent_id, ar.room AS agent_room
    FROM turns t
    JOIN agents a ON a.workspace_id = t.workspace_id
    -- NULL: no cap of its own (least() below then ignores it).
    CROSS JOIN LATERAL (
        SELECT CASE WHEN a.max_concurrency IS NOT NULL THEN greatest(0, a.max_concurrency - (
            SELECT coalesce(sum(n), 0) FROM agent_running_counts ac
            WHERE ac.workspace_id = a.workspace_id AND ac.agent_id = a.agent_id)) END AS room
    ) ar
    WHERE ar.room IS NULL OR ar.room > 0
), share AS MATERIALIZED (
    -- The batch left after the lapsed leases, and the runs of each agent the round
    -- robin can need when every workspace in turn has that many: the batch over the
    -- workspaces, rounded up, and one more, which tells a workspace that keeps due
    -- runs after this claim from one it may empty.
    SELECT b.left, ceil(greatest(b.left, 1)::numeric / greatest(
               (SELECT count(*) FROM turns), 1))::int + 1 AS runs
    FROM (SELECT cardinality($1::text[]) - (SELECT count(*) FROM lapsed) AS left) b
), first_pass AS (
    -- Each agent's first runs, up to its share: with 64 workspaces in turn and a batch
    -- of 64, two runs each instead of 64 (never more than the batch: a workspace with
    -- vast room must not make a one-run claim read its whole backlog).
    SELECT q.workspace_id, q.ord, q.room, c.run_id, c.priority, c.wake_at
    FROM (SELECT r.*, least(r.room, r.agent_room, (SELECT runs FROM share)) AS runs
          FROM agent_rooms r) q
    CROSS JOIN LATERAL (
        -- The agent's queue one priority level at a time, highest first (0026's
        -- runs_due_by_priority): each level is one index descent to find and one
        -- range probe that stops at the level's first run not yet due, so parked
        -- runs are never read. Levels come out highest first and each level's runs
        -- oldest first, and the LIMIT stops the walk once it has enough: lower
        -- levels are not even looked up.
        WITH RECURSIVE levels(priority) AS (
            (SELECT r.priority FROM runs r
             WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
               AND r.status IN ('queued', 'waiting')
             ORDER BY r.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT r.priority FROM runs r
                    WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                      AND r.status IN ('queued', 'waiting') AND r.priority < l.priority
                    ORDER BY r.priority DESC LIMIT 1)
            FROM levels l WHERE l.priority IS NOT NULL
        )
        SELECT d.run_id, l.priority, d.wake_at
        FROM levels l
        CROSS JOIN LATERAL (
            SELECT r.run_id, r.wake_at FROM runs r
            WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
              AND r.priority = l.priority
              AND r.status IN ('queued', 'waiting') AND r.wake_at <= (SELECT now FROM clock)
              AND ((SELECT any_release FROM routing) OR r.release = ANY($7::text[])
                   OR (r.release IS NULL AND (SELECT takes_new FROM routing)))
              AND ($6::jsonb IS NULL OR EXISTS (
                  SELECT 1 FROM agent_versions v
                  WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                    AND v.version = r.agent_version
                    AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $6::jsonb))
            ORDER BY r.wake_at, r.run_id
            LIMIT q.runs
        ) d
        LIMIT q.runs
    ) c
), short AS MATERIALIZED (
    -- Whether the first pass may have left out a run the round robin takes: it has
    -- fewer than the batch left within min(share, room) of each workspace (some had
    -- fewer due runs than their share). Otherwise every run picked is among the first
    -- min(share, room) of its workspace, which the first pass read in full, so the
    -- picks are exactly those a pass reading up to the batch would make.
    SELECT coalesce(sum(least(f.n, f.room, (SELECT runs FROM share))), 0)
           < (SELECT s.left FROM share s) AS short
    FROM (SELECT workspace_id, room, count(*) AS n FROM first_pass
          GROUP BY workspace_id, room) f
), second_pass AS (
    -- Only when short: every agent's first runs up to the batch (never more).
    SELECT q.workspace_id, q.ord, q.room, c.run_id, c.priority, c.wake_at
    FROM (SELECT r.*, least(r.room, r.agent_room, cardinality($1::text[])) AS runs
          FROM agent_rooms r WHERE (SELECT short FROM short)) q
    CROSS JOIN LATERAL (  -- the same walk as first_pass's
        WITH RECURSIVE levels(priority) AS (
            (SELECT r.priority FROM runs r
             WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
               AND r.status IN ('queued', 'waiting')
             ORDER BY r.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT r.priority FROM runs r
                    WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                      AND r.status IN ('queued', 'waiting') AND r.priority < l.priority
                    ORDER BY r.priority DESC LIMIT 1)
            FROM levels l WHERE l.priority IS NOT NULL
        )
        SELECT d.run_id, l.priority, d.wake_at
        FROM levels l
        CROSS JOIN LATERAL (
            SELECT r.run_id, r.wake_at FROM runs r
            WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
              AND r.priority = l.priority
              AND r.status IN ('queued', 'waiting') AND r.wake_at <= (SELECT now FROM clock)
              AND ((SELECT any_release FROM routing) OR r.release = ANY($7::text[])
                   OR (r.release IS NULL AND (SELECT takes_new FROM routing)))
              AND ($6::jsonb IS NULL OR EXISTS (
                  SELECT 1 FROM agent_versions v
                  WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                    AND v.version = r.agent_version
                    AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $6::jsonb))
            ORDER BY r.wake_at, r.run_id
            LIMIT q.runs
        ) d
        LIMIT q.runs
    ) c
), candidates AS (
    SELECT * FROM first_pass WHERE NOT (SELECT short FROM short)
    UNION ALL
    SELECT * FROM second_pass
), picked AS (
    SELECT workspace_id, run_id FROM (
        SELECT workspace_id, run_id, ord, room,
               row_number() OVER (PARTITION BY workspace_id
                                  ORDER BY priority DESC, wake_at, run_id) AS turn
        FROM candidates
    ) ranked
    WHERE turn <= room
    ORDER BY turn, ord
    LIMIT cardinality($1::text[]) - (SELECT count(*) FROM lapsed)
), fresh AS (
    -- One primary-key probe per picked run, whatever the statistics say:
    -- joined any other way, the planner may walk every due run instead.
    SELECT r.workspace_id, r.run_id
    FROM picked p
    CROSS JOIN LATERAL (
        SELECT r.workspace_id, r.run_id FROM runs r
        WHERE r.workspace_id = p.workspace_id AND r.run_id = p.run_id
          AND r.status IN ('queued', 'waiting') AND r.wake_at <= (SELECT now FROM clock)
        FOR UPDATE SKIP LOCKED
    ) r
), kept AS (
    -- The workspaces left with a due run this claim read and did not pick: they need
    -- no new next_wake_at (lease.py skips raising it).
    SELECT workspace_id FROM candidates GROUP BY workspace_id
    HAVING count(*) > (SELECT count(*) FROM picked p WHERE p.workspace_id = candidates.workspace_id)
), due AS (
    -- taken_over: the run's lease had lapsed (its executor died or stalled).
    SELECT workspace_id, run_id, taken_over, row_number() OVER () AS slot,
           workspace_id IN (SELECT workspace_id FROM kept) AS keeps_due
    FROM (SELECT *, true AS taken_over FROM lapsed
          UNION ALL SELECT *, false FROM fresh) d
), served AS (
    -- A workspace that got a run, or had none it could take (all its agents
    -- at their caps), goes to the back of the line; one that lost out only
    -- to a full batch keeps its place.
    UPDATE workspaces w SET last_served_at = (SELECT now FROM clock)
    WHERE w.workspace_id = ANY($4::text[])
      AND (w.workspace_id IN (SELECT workspace_id FROM fresh)
           OR w.workspace_id NOT IN (SELECT workspace_id FROM candidates))
)
UPDATE runs r SET
    status = 'running',
    wait_reason = NULL,
    release = coalesce(r.release, $8::text),
    lease_owner = ($1::text[])[due.slot],
    lease_epoch = r.lease_epoch + 1,
    attempt = r.attempt + (r.status = 'running')::int,
    wake_at = (SELECT now FROM clock) + make_interval(secs => $2),
    -- A new hold begins; a takeover first counts the lapsed hold up to its
    -- lease expiry (0006_run_limits.sql).
    active_seconds = r.active_seconds + CASE WHEN r.status = 'running'
        THEN run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock)) ELSE 0 END,
    held_since = (SELECT now FROM clock),
    started_at = coalesce(r.started_at, (SELECT now FROM clock)),
    updated_at = now()
FROM due
WHERE r.workspace_id = due.workspace_id AND r.run_id = due.run_id
RETURNING r.*, run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock)) AS held_seconds,
    due.taken_over, due.keeps_due;

-- name: workspace_lock_for_raise :many
-- Upgrade the claim's locks on these workspaces to FOR UPDATE, skipping any
-- that an admission or wake-up still holds KEY SHARE on.
SELECT workspace_id FROM workspaces
WHERE workspace_id = ANY($1::text[])
ORDER BY workspace_id
FOR UPDATE SKIP LOCKED;

-- name: workspace_raise_next_wake :exec
-- Set next_wake_at to the earliest wake_at of each workspace's queued or
-- waiting runs (NULL: none), one index probe per agent.
UPDATE workspaces w SET next_wake_at = (
    SELECT min(first.wake_at)
    FROM agents a
    CROSS JOIN LATERAL (
        SELECT r.wake_at FROM runs r
        WHERE r.workspace_id = a.workspace_id AND r.agent_id = a.agent_id
          AND r.status IN ('queued', 'waiting') AND r.wake_at IS NOT NULL
        ORDER BY r.wake_at
        LIMIT 1
    ) first
    WHERE a.workspace_id = w.workspace_id
)
WHERE w.workspace_id = ANY($1::text[]);

-- name: run_queue_position :one
-- Where a queued or waiting run stands: its workspace's and agent's running
-- counts and caps, and how many runs of the workspace the claim takes before
-- it: those of higher priority due by the time it is, and those of its own
-- priority with an earlier wake time (runs of another agent at its cap are
-- passed over, so they are not counted). No row for a run that is not
-- waiting its turn.
WITH me AS (
    SELECT r.workspace_id, r.run_id, r.agent_id, r.wake_at, r.priority,
           r.wake_at <= coalesce($3::timestamptz, now()) AS due,
           greatest(r.wake_at, coalesce($3::timestamptz, now())) AS due_by
    FROM runs r
    WHERE r.workspace_id = $1 AND r.run_id = $2
      AND r.status IN ('queued', 'waiting') AND r.wake_at IS NOT NULL
)
SELECT me.due,
       workspace_running(w.workspace_id) AS workspace_running,
       w.max_concurrency AS workspace_max_concurrency,
       agent_running(a.workspace_id, a.agent_id) AS agent_running,
       a.max_concurrency AS agent_max_concurrency,
       (SELECT coalesce(sum(ahead.n + higher.n), 0)
        FROM agents o
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM runs x
            WHERE x.workspace_id = o.workspace_id AND x.agent_id = o.agent_id
              AND x.status IN ('queued', 'waiting') AND x.priority = me.priority
              AND x.wake_at <= me.wake_at
              AND (x.wake_at < me.wake_at OR x.run_id < me.run_id)
        ) ahead
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM runs x
            WHERE x.workspace_id = o.workspace_id AND x.agent_id = o.agent_id
              AND x.status IN ('queued', 'waiting') AND x.priority > me.priority
              AND x.wake_at <= me.due_by
        ) higher
        WHERE o.workspace_id = me.workspace_id
          AND (o.agent_id = me.agent_id OR o.max_concurrency IS NULL
               OR agent_running(o.workspace_id, o.agent_id) < o.max_concurrency))::bigint
       AS runs_ahead
FROM me
JOIN workspaces w ON w.workspace_id = me.workspace_id
JOIN agents a ON a.workspace_id = me.workspace_id AND a.agent_id = me.agent_id;

-- name: run_heartbeat :many
-- Renew every lease an executor holds, in one statement, while the run is
-- within its limits: active time (the holds so far, this one included) under
-- its deadline, and its max age not passed. A lease missing from the result
-- was lost (taken, cancelled, finished) or is past a limit. Database clock
-- unless $6 fixes it.
WITH clock AS MATERIALIZED (
    SELECT coalesce($6::timestamptz, now()) AS now
)
UPDATE runs r SET wake_at = (SELECT now FROM clock) + make_interval(secs => $5), updated_at = now()
FROM unnest($2::text[], $3::uuid[], $4::bigint[]) AS h(workspace_id, run_id, epoch)
WHERE r.workspace_id = h.workspace_id AND r.run_id = h.run_id
  AND r.lease_epoch = h.epoch AND r.lease_owner = $1 AND r.status = 'running'
  AND r.active_seconds + run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock))
      < r.deadline_seconds
  AND (r.expires_at IS NULL OR r.expires_at > (SELECT now FROM clock))
RETURNING r.workspace_id, r.run_id, r.lease_epoch, r.wake_at;

-- name: run_fail_past_deadline :many
-- Fail held runs past a limit (the heartbeat refused them): "deadline
-- exceeded" once their active time reached the deadline, "max age exceeded"
-- once their max age passed. Database clock unless $4 fixes it.
WITH clock AS MATERIALIZED (
    SELECT coalesce($4::timestamptz, now()) AS now
), past AS (
    SELECT r.workspace_id, r.run_id,
           CASE WHEN r.expires_at <= (SELECT now FROM clock) THEN 'max age exceeded'
                ELSE 'deadline exceeded' END AS error
    FROM runs r
    JOIN unnest($1::text[], $2::uuid[], $3::bigint[]) AS h(workspace_id, run_id, epoch)
      ON r.workspace_id = h.workspace_id AND r.run_id = h.run_id AND r.lease_epoch = h.epoch
    WHERE r.status = 'running'
      AND (r.expires_at <= (SELECT now FROM clock)
           OR r.active_seconds + run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock))
              >= r.deadline_seconds)
    FOR NO KEY UPDATE OF r
), failed AS (
    UPDATE runs r SET status = 'failed', error = p.error, wake_at = NULL,
                      lease_owner = NULL, step_count = r.step_count + 1, finished_at = (SELECT now FROM clock), updated_at = now()
    FROM past p
    WHERE r.workspace_id = p.workspace_id AND r.run_id = p.run_id
    RETURNING r.workspace_id, r.run_id, r.lease_epoch, r.error
), finish_step AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
    SELECT f.workspace_id, f.run_id,
           (SELECT coalesce(max(seq), -1) + 1 FROM steps s
            WHERE s.workspace_id = f.workspace_id AND s.run_id = f.run_id),
           'finish', f.lease_epoch, jsonb_build_object('status', 'failed', 'error', f.error)
    FROM failed f
)
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
), finish_step AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
    SELECT f.workspace_id, f.run_id,
           (SELECT coalesce(max(seq), -1) + 1 FROM steps s
            WHERE s.workspace_id = f.workspace_id AND s.run_id = f.run_id),
           'finish', f.lease_epoch, jsonb_build_object('status', 'failed', 'error', $4::text)
    FROM failed f
)
SELECT * FROM failed;

-- name: run_fail_past_max_age :many
-- Fail up to $1 runs past their max age that nobody holds: queued, parked
-- (on a time or on an event that may never come), or with a lapsed lease.
-- Held runs are the heartbeat's (it refuses them). Database clock unless $2.
WITH clock AS MATERIALIZED (
    SELECT coalesce($2::timestamptz, now()) AS now
), expired AS (
    SELECT r.workspace_id, r.run_id FROM runs r
    WHERE r.expires_at IS NOT NULL AND r.expires_at <= (SELECT now FROM clock)
      AND (r.status IN ('queued', 'waiting')
           OR (r.status = 'running' AND r.wake_at <= (SELECT now FROM clock)))
    ORDER BY r.expires_at
    LIMIT $1
    FOR NO KEY UPDATE SKIP LOCKED
), failed AS (
    UPDATE runs r SET status = 'failed', error = 'max age exceeded', wait_reason = NULL,
                      step_count = r.step_count + 1, wake_at = NULL, lease_owner = NULL, finished_at = (SELECT now FROM clock),
                      updated_at = now()
    FROM expired e
    WHERE r.workspace_id = e.workspace_id AND r.run_id = e.run_id
    RETURNING r.workspace_id, r.run_id, r.lease_epoch
), finish_step AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
    SELECT f.workspace_id, f.run_id,
           (SELECT coalesce(max(seq), -1) + 1 FROM steps s
            WHERE s.workspace_id = f.workspace_id AND s.run_id = f.run_id),
           'finish', f.lease_epoch,
           jsonb_build_object('status', 'failed', 'error', 'max age exceeded')
    FROM failed f
)
SELECT workspace_id, run_id, lease_epoch FROM failed;

-- name: run_release_unassigned :exec
-- Give back a just-claimed run that could not be delivered (its executor
-- went away): runnable again now, under a new epoch at the next claim.
-- Database clock unless $4 fixes it. A run that never ran a step (only its
-- input) is on no release yet: the claim that could not deliver it set one.
UPDATE runs SET status = 'waiting', wait_reason = 'handoff', lease_owner = NULL,
                release = CASE WHEN step_count <= 1 THEN NULL ELSE release END,
                wake_at = coalesce($4::timestamptz, now()), updated_at = now()
WHERE workspace_id = $1 AND run_id = $2 AND lease_epoch = $3 AND status = 'running';

-- name: run_release_on_break :many
-- An executor's stream ended (closed, reset, or declared silent): let the runs
-- it held there, at these epochs, be taken over once $5 seconds have passed,
-- or when their lease lapses if that is sooner ("Release on break" at the top
-- of this file says why this is safe). Epochs and fencing are untouched.
-- Database clock unless $6 fixes it.
WITH clock AS MATERIALIZED (
    SELECT coalesce($6::timestamptz, now()) + make_interval(secs => $5) AS release_at
)
UPDATE runs r SET wake_at = (SELECT release_at FROM clock), updated_at = now()
FROM unnest($2::text[], $3::uuid[], $4::bigint[]) AS h(workspace_id, run_id, epoch)
WHERE r.workspace_id = h.workspace_id AND r.run_id = h.run_id
  AND r.lease_epoch = h.epoch AND r.lease_owner = $1 AND r.status = 'running'
  AND r.wake_at > (SELECT release_at FROM clock)
RETURNING r.workspace_id, r.run_id, r.lease_epoch, r.wake_at;
