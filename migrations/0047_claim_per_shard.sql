-- The claim per shard (issue 50, build item 3): the turn order moves out of
-- `workspaces` into workspace_turns, a table that stays on the coordinator
-- under Citus, and the claim becomes three parts: turns taken there, a lease
-- step on each shard that holds one of them (agentrun_claim_shard: the caps
-- checked beside the running counts, lapsed leases taken over there), the
-- turns marked and the emptied workspaces' next_wake_at raised there. Today's
-- claim is one function whose statements lock workspaces, runs and counts of
-- every shard at once, which Citus refuses. On plain PostgreSQL the same
-- functions run with one shard (agentrun_shard_of is 0).
--
-- Lapsed leases are now taken over at their workspace's turn, not by a scan
-- of every shard, so next_wake_at also bounds the leases' ends: the raise
-- reads the first lease end beside the first due run, and a run whose lease
-- is cut short (a release on break) or begun outside the claim (the fast
-- path) lowers it, as a wake-up does. A workspace at its cap or with its
-- queue paused is not known to the coordinator: its turn is taken and spent
-- (to the back of the line, as one whose runs no owner can run), and the
-- raise moves it past its due runs while its queue is paused (resuming lowers
-- it again).

CREATE TABLE workspace_turns (
    workspace_id     text PRIMARY KEY,
    -- When the fair claim last served this workspace: the line's order.
    last_served_at   timestamptz NOT NULL DEFAULT '-infinity',
    -- A lower bound on the earliest wake_at of the workspace's queued or
    -- waiting runs and of its leases' ends (NULL: none). Writers only lower
    -- it (workspace_lower_next_wake); the claim raises it, under a lock that
    -- keeps every writer that could lower it out (section 7).
    next_wake_at     timestamptz
);

-- Workspaces that may have something due, by when (the claim's step 1).
CREATE INDEX workspace_turns_due ON workspace_turns (next_wake_at) WHERE next_wake_at IS NOT NULL;

INSERT INTO workspace_turns (workspace_id, last_served_at, next_wake_at)
SELECT w.workspace_id, w.last_served_at, least(w.next_wake_at, (
    SELECT min(r.wake_at) FROM runs r
    WHERE r.workspace_id = w.workspace_id AND r.status = 'running'))
FROM workspaces w;

-- Under Citus, the wakes lowered on the shards: a trigger firing on a shard
-- cannot reach workspace_turns on the coordinator, so the distribution step
-- (control_plane/store/citus.py) makes workspace_lower_next_wake write here,
-- beside the runs, and each claim folds the due ones into workspace_turns
-- first. Empty on plain PostgreSQL.
CREATE TABLE workspace_wakes (
    workspace_id     text PRIMARY KEY,
    wake_at          timestamptz NOT NULL
);

CREATE INDEX workspace_wakes_due ON workspace_wakes (wake_at);

DROP INDEX workspaces_due;
ALTER TABLE workspaces DROP COLUMN last_served_at, DROP COLUMN next_wake_at;

-- A workspace's leases by their end: the claim's takeover and raise, per workspace.
CREATE INDEX runs_leases_by_workspace ON runs (workspace_id, wake_at) WHERE status = 'running';

-- Lower a workspace's next_wake_at to `wake` (the row made on its first wake).
-- The KEY SHARE lock, held until the transaction ends, is what keeps a claim
-- from raising next_wake_at past a run this transaction made due.
CREATE OR REPLACE FUNCTION workspace_lower_next_wake(ws text, wake timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM workspace_turns WHERE workspace_id = ws FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO workspace_turns (workspace_id, next_wake_at) VALUES (ws, wake)
        ON CONFLICT (workspace_id) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
        PERFORM 1 FROM workspace_turns WHERE workspace_id = ws FOR KEY SHARE;
    END IF;
    UPDATE workspace_turns SET next_wake_at = wake
    WHERE workspace_id = ws AND (next_wake_at IS NULL OR next_wake_at > wake);
END $$;

-- One run changed status or wake time: move the running counts, and lower
-- next_wake_at for a run that waits with a wake time (as wake-ups do: KEY
-- SHARE, then an update only when it lowers it; a finish does not write the
-- turn row at all), for a lease begun outside the claim, and for a lease cut
-- short (a release on break: its takeover comes at its workspace's turn).
CREATE OR REPLACE FUNCTION runs_fair_on_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    delta integer := (NEW.status = 'running')::int - (OLD.status = 'running')::int;
    pending_wake timestamptz := CASE
        WHEN NEW.status IN ('queued', 'waiting') THEN NEW.wake_at
        WHEN NEW.status = 'running'
             AND (OLD.status IS DISTINCT FROM 'running' OR NEW.wake_at < OLD.wake_at)
        THEN NEW.wake_at END;
BEGIN
    IF delta <> 0 THEN
        PERFORM running_counts_add(NEW.workspace_id, NEW.agent_id, delta);
    END IF;
    IF pending_wake IS NOT NULL THEN
        PERFORM workspace_lower_next_wake(NEW.workspace_id, pending_wake);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER runs_fair_update ON runs;
CREATE TRIGGER runs_fair_update AFTER UPDATE OF status, wake_at ON runs FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           OR (NEW.status IN ('queued', 'waiting') AND NEW.wake_at IS DISTINCT FROM OLD.wake_at)
           OR (NEW.status = 'running' AND NEW.wake_at < OLD.wake_at))
          AND NOT (NEW.status = 'running' AND OLD.status IS DISTINCT FROM 'running'
                   AND coalesce(current_setting('agentrun.claim_counts', true), '') = 'on'))
    EXECUTE FUNCTION runs_fair_on_update();

-- Admissions, once per statement: a bulk import touches each workspace once.
CREATE OR REPLACE FUNCTION runs_fair_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    due record;
BEGIN
    FOR due IN
        SELECT workspace_id, min(wake_at) AS wake FROM inserted
        WHERE status IN ('queued', 'waiting', 'running') AND wake_at IS NOT NULL
        GROUP BY workspace_id ORDER BY workspace_id
    LOOP
        PERFORM workspace_lower_next_wake(due.workspace_id, due.wake);
    END LOOP;
    -- Admission never inserts running runs; a bulk load might.
    PERFORM running_counts_add(n.workspace_id, n.agent_id, n.held)
    FROM (SELECT workspace_id, agent_id, count(*) AS held FROM inserted WHERE status = 'running'
          GROUP BY workspace_id, agent_id ORDER BY workspace_id, agent_id) n;
    RETURN NULL;
END $$;

-- TRUNCATE fires no row triggers: with no runs left, nothing runs or is due.
CREATE OR REPLACE FUNCTION runs_fair_on_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workspace_running_counts;
    DELETE FROM agent_running_counts;
    UPDATE workspace_turns SET next_wake_at = NULL WHERE next_wake_at IS NOT NULL;
    RETURN NULL;
END $$;

DROP FUNCTION agentrun_claim(text[], double precision, timestamptz, text[], jsonb, text[],
                             text, double precision, boolean);
DROP FUNCTION agentrun_claim_uncounted(text[], double precision, timestamptz, text[], jsonb,
                                       text[], text, double precision, boolean);

-- release_share() as PL/pgSQL: Citus plans no SQL function with parameters
-- over its tables (`releases` is a reference table there); the same statement.
CREATE OR REPLACE FUNCTION release_share(own text, live double precision, gated boolean)
RETURNS TABLE (lo integer, hi integer, reads_from integer, writes integer) LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH open AS (
        SELECT rl.release, rl.ramp_percent, coalesce(rl.promoted_at, rl.first_seen_at) AS since
        FROM releases rl
        WHERE rl.draining_since IS NULL
          AND (NOT gated OR release_opened(rl.canary_passed_at, rl.canary_failed_at,
                                           rl.promoted_at))
          AND (rl.release = own OR EXISTS (
            SELECT 1 FROM executor_tools e
            WHERE e.release = rl.release AND e.last_seen > now() - make_interval(secs => live)))
    ), main AS (
        SELECT release FROM open WHERE ramp_percent IS NULL
        ORDER BY since DESC, release DESC LIMIT 1
    ), ramp AS (
        SELECT release, ramp_percent FROM open WHERE ramp_percent IS NOT NULL
        ORDER BY since DESC, release DESC LIMIT 1
    )
    SELECT CASE WHEN own = (SELECT release FROM main)
                THEN coalesce((SELECT ramp_percent FROM ramp), 0) ELSE 0 END,
           CASE WHEN own = (SELECT release FROM main) THEN 100
                WHEN own = (SELECT release FROM ramp)
                THEN CASE WHEN EXISTS (SELECT 1 FROM main) THEN (SELECT ramp_percent FROM ramp)
                          ELSE 100 END
                ELSE 0 END,
           coalesce((SELECT rl.log_reads_from FROM releases rl WHERE rl.release = own), 0),
           coalesce((SELECT rl.log_version FROM releases rl WHERE rl.release = own), 2147483647)
;
END $$;

-- agentrun_claim_shard(): the lease step on one shard, for the turns `ids`
-- (all on it) taken on the coordinator: a. lock their workspace rows, b. take
-- their lapsed leases and their due runs round robin within the caps, count
-- the fresh ones. Returns each claimed run, then a row per locked workspace
-- (run NULL): whether it was served and whether it may be empty. The DO block
-- creates it with the read of an agent's due runs the server does best (0037).
DO $claim_walk$
DECLARE
    -- Before Postgres 18: the walk over priority levels.
    levels constant text := $levels$
            WITH RECURSIVE levels(priority) AS (
                (SELECT r.priority FROM runs r
                 WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                  AND r.workspace_id = ANY(turn_ids::text[])
                   AND r.status IN ('queued', 'waiting')
                 ORDER BY r.priority DESC LIMIT 1)
                UNION ALL
                SELECT (SELECT r.priority FROM runs r
                        WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                  AND r.workspace_id = ANY(turn_ids::text[])
                          AND r.status IN ('queued', 'waiting') AND r.priority < l.priority
                        ORDER BY r.priority DESC LIMIT 1)
                FROM levels l WHERE l.priority IS NOT NULL
            )
            SELECT d.run_id, l.priority, d.wake_at
            FROM levels l
            CROSS JOIN LATERAL (
                SELECT r.run_id, r.wake_at FROM runs r
                WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                  AND r.workspace_id = ANY(turn_ids::text[])
                  AND r.priority = l.priority
                  AND r.status IN ('queued', 'waiting') AND r.wake_at <= (SELECT now FROM clock)
                  AND NOT r.paused
                  AND ((SELECT any_release FROM routing) OR r.release = ANY($6::text[])
                       OR (r.release IS NULL
                           AND release_takes(r.run_id, (SELECT lo FROM routing), (SELECT hi FROM routing))
                           AND r.log_version BETWEEN (SELECT reads_from FROM routing)
                                                 AND (SELECT writes FROM routing)))
                  AND ($5::jsonb IS NULL OR EXISTS (
                      SELECT 1 FROM agent_versions v
                      WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                        AND v.workspace_id = ANY(locked::text[])
                        AND v.version = r.agent_version
                        AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $5::jsonb))
                ORDER BY r.wake_at, r.run_id
                LIMIT q.runs
            ) d
            LIMIT q.runs
$levels$;
    -- Postgres 18 and later: the same runs in the same order, by a skip scan
    -- of runs_due_by_priority.
    skip_scan constant text := $skip_scan$
            SELECT r.run_id, r.priority, r.wake_at FROM runs r
            WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                  AND r.workspace_id = ANY(turn_ids::text[])
              AND r.status IN ('queued', 'waiting') AND r.wake_at <= (SELECT now FROM clock)
                  AND NOT r.paused
              AND ((SELECT any_release FROM routing) OR r.release = ANY($6::text[])
                   OR (r.release IS NULL
                       AND release_takes(r.run_id, (SELECT lo FROM routing), (SELECT hi FROM routing))
                       AND r.log_version BETWEEN (SELECT reads_from FROM routing)
                                             AND (SELECT writes FROM routing)))
              AND ($5::jsonb IS NULL OR EXISTS (
                  SELECT 1 FROM agent_versions v
                  WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                        AND v.workspace_id = ANY(locked::text[])
                    AND v.version = r.agent_version
                    AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $5::jsonb))
            ORDER BY r.priority DESC, r.wake_at, r.run_id
            LIMIT q.runs
$skip_scan$;
BEGIN
    EXECUTE replace($function$
CREATE OR REPLACE FUNCTION agentrun_claim_shard(
    owners text[], lease_seconds double precision, at timestamptz, ids text[],
    carried jsonb, continued text[], own_release text, live_seconds double precision,
    gated boolean)
RETURNS TABLE (run runs, held_seconds double precision, taken_over boolean, keeps_due boolean,
               metered boolean, workspace_id text, served boolean, maybe_empty boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off
SET enable_mergejoin = off
SET agentrun.claim_counts = 'on'
AS $claim$
-- The result's columns are variables too: in the statements the names mean
-- the columns they always meant.
#variable_conflict use_column
DECLARE
    locked text[];
    caps integer[];
    counted text[];
    running numeric[];
    rooms bigint[];
    turn_ids text[];
    gone text[];
    share_lo integer;
    share_hi integer;
    share_reads integer;
    share_writes integer;
    metered_ids text[];
    served_ids text[];
    out_runs runs[];
    out_held double precision[];
    out_taken boolean[];
    out_keeps boolean[];
BEGIN
    -- a. Lock the turns' workspace rows here, beside their runs and counts, as
    -- the fast path locks them, skipping those another claimer or a fast path
    -- holds. A workspace whose queue is paused is locked (its lapsed leases are
    -- taken over) but gets no fresh run. Then, a new statement, their room
    -- under the cap (step b reads it again). Citus locks rows of one shard
    -- only by a statement over that table alone: the counts are read apart.
    SELECT array_agg(t.workspace_id ORDER BY t.ord), array_agg(t.max_concurrency ORDER BY t.ord),
           array_agg(t.workspace_id ORDER BY t.ord) FILTER (WHERE NOT t.queue_paused)
    INTO locked, caps, turn_ids
    FROM (
        SELECT w.workspace_id, l.ord, w.queue_paused, w.max_concurrency
        FROM workspaces w
        JOIN unnest($4::text[]) WITH ORDINALITY AS l(workspace_id, ord) USING (workspace_id)
        WHERE w.workspace_id = ANY($4::text[])
        FOR NO KEY UPDATE OF w SKIP LOCKED
    ) t;
    SELECT array_agg(c.workspace_id), array_agg(c.running) INTO counted, running
    FROM (SELECT c.workspace_id, sum(c.n) AS running FROM workspace_running_counts c
          WHERE c.workspace_id = ANY(locked) GROUP BY c.workspace_id) c;
    SELECT array_agg(l.cap - coalesce(c.running, 0) ORDER BY l.ord) INTO rooms
    FROM unnest(locked, caps) WITH ORDINALITY AS l(workspace_id, cap, ord)
    LEFT JOIN unnest(counted, running) AS c(workspace_id, running) USING (workspace_id);
    locked := coalesce(locked, '{}');
    rooms := coalesce(rooms, '{}');
    turn_ids := coalesce(turn_ids, '{}');
    -- Turns of workspaces that no longer exist: served, and raised to nothing.
    IF cardinality(locked) < cardinality($4) THEN
        SELECT array_agg(g.workspace_id) INTO gone FROM unnest($4::text[]) AS g(workspace_id)
        WHERE g.workspace_id <> ALL(locked) AND NOT EXISTS (
            SELECT 1 FROM workspaces w
            WHERE w.workspace_id = g.workspace_id AND w.workspace_id = ANY($4::text[]));
    END IF;
    -- The share of the runs on no release that these owners take (release_share), a
    -- statement of its own: Citus plans no SQL function over its tables inside
    -- the lease statement.
    -- Owners of no release: no share, every version (what release_share says).
    IF $7 IS NULL THEN
        share_lo := 0; share_hi := 0; share_reads := 0; share_writes := 2147483647;
    ELSE
        SELECT s.lo, s.hi, s.reads_from, s.writes
        INTO share_lo, share_hi, share_reads, share_writes
        FROM release_share($7, $8, $9) s;
    END IF;
    -- b. Lapsed leases of the locked workspaces first, then the due runs of those
    -- open to them, round robin, within each workspace's and agent's room
    -- (schema.sql section 7 says how).
    WITH clock AS MATERIALIZED (
        SELECT coalesce($3::timestamptz, now()) AS now
    ), routing AS MATERIALIZED (
        -- The share of the runs on no release that these owners take (read above).
        SELECT $6::text[] IS NULL AS any_release, share_lo AS lo, share_hi AS hi,
               share_reads AS reads_from, share_writes AS writes
    ), lapsed AS (
        SELECT r.workspace_id, r.run_id FROM runs r
        WHERE r.status = 'running' AND r.wake_at <= (SELECT now FROM clock) AND NOT r.paused
          AND r.workspace_id = ANY(locked::text[])
          AND ((SELECT any_release FROM routing) OR r.release = ANY($6::text[])
               OR (r.release IS NULL
                   AND release_takes(r.run_id, (SELECT lo FROM routing), (SELECT hi FROM routing))
                   AND r.log_version BETWEEN (SELECT reads_from FROM routing)
                                         AND (SELECT writes FROM routing)))
          AND ($5::jsonb IS NULL OR EXISTS (
              SELECT 1 FROM agent_versions v
              WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                        AND v.workspace_id = ANY(locked::text[])
                AND v.version = r.agent_version
                AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $5::jsonb))
        ORDER BY r.wake_at
        LIMIT cardinality($1::text[])
        FOR UPDATE SKIP LOCKED
    ), turns AS (
        -- The running counts (0027_running_counts.sql), read by this statement's
        -- snapshot: it sees every claim that held the workspace's lock before.
        SELECT w.workspace_id, l.ord, w.max_concurrency - c.running AS room
        FROM unnest(turn_ids::text[]) WITH ORDINALITY AS l(workspace_id, ord)
        JOIN workspaces w USING (workspace_id)
        CROSS JOIN LATERAL (
            SELECT coalesce(sum(n), 0) AS running FROM workspace_running_counts c
            WHERE c.workspace_id = w.workspace_id AND c.workspace_id = ANY(turn_ids::text[])) c
        WHERE w.workspace_id = ANY(turn_ids::text[]) AND c.running < w.max_concurrency
    ), agent_rooms AS (
        SELECT t.workspace_id, t.ord, t.room, a.agent_id, ar.room AS agent_room
        FROM turns t
        JOIN agents a ON a.workspace_id = t.workspace_id AND a.workspace_id = ANY(turn_ids::text[])
        -- NULL: no cap of its own (least() below then ignores it).
        CROSS JOIN LATERAL (
            SELECT CASE WHEN a.max_concurrency IS NOT NULL THEN greatest(0, a.max_concurrency - (
                SELECT coalesce(sum(n), 0) FROM agent_running_counts ac
                WHERE ac.workspace_id = a.workspace_id AND ac.agent_id = a.agent_id
                  AND ac.workspace_id = ANY(turn_ids::text[]))) END AS room
        ) ar
        WHERE (ar.room IS NULL OR ar.room > 0) AND NOT a.paused
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
            /* the agent's due runs */
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
        CROSS JOIN LATERAL (  -- the same as first_pass's
            /* the agent's due runs */
        ) c
    ), candidates AS (
        SELECT * FROM first_pass WHERE NOT (SELECT short FROM short)
        UNION ALL
        SELECT * FROM second_pass
    ), picked AS (
        -- turn: the candidate's place in its workspace; n: how many it has there.
        SELECT workspace_id, run_id, turn, n FROM (
            SELECT workspace_id, run_id, ord, room,
                   row_number() OVER (PARTITION BY workspace_id
                                      ORDER BY priority DESC, wake_at, run_id) AS turn,
                   count(*) OVER (PARTITION BY workspace_id) AS n
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
              AND r.workspace_id = ANY(turn_ids::text[])
              AND r.status IN ('queued', 'waiting') AND r.wake_at <= (SELECT now FROM clock)
                  AND NOT r.paused
            FOR UPDATE SKIP LOCKED
        ) r
    ), kept AS (
        -- The workspaces left with a due run this claim read and did not pick: they need
        -- no new next_wake_at (lease.py skips raising it). A workspace's picks are its
        -- first turns (picked cuts in order of turn), so it kept one unless its last
        -- candidate (turn n) was picked.
        SELECT workspace_id FROM candidates
        EXCEPT
        SELECT workspace_id FROM picked WHERE turn = n
    ), due AS (
        -- taken_over: the run's lease had lapsed (its executor died or stalled).
        SELECT workspace_id, run_id, taken_over, ($1::text[])[row_number() OVER ()] AS owner,
               workspace_id IN (SELECT workspace_id FROM kept) AS keeps_due
        FROM (SELECT *, true AS taken_over FROM lapsed
              UNION ALL SELECT *, false FROM fresh) d
    ), leased AS (
        UPDATE runs r SET
            status = 'running',
            wait_reason = NULL,
            release = coalesce(r.release, $7::text),
            log_version = greatest(r.log_version, coalesce(
                (SELECT writes FROM routing WHERE $7::text IS NOT NULL), 0)),
            lease_owner = due.owner,
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
          AND r.workspace_id = ANY(locked::text[])
        RETURNING r AS run, run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock)) AS held_seconds,
            due.taken_over, due.keeps_due
    )
    SELECT array_agg(c.run), array_agg(c.held_seconds), array_agg(c.taken_over),
           array_agg(c.keeps_due),
           -- Served: got a fresh run, or had none these owners could take (at its caps,
           -- paused, tools the owners do not carry, another release): to the back of the
           -- line. One that lost out only to a full batch keeps its place.
           (SELECT array_agg(l.workspace_id) FROM unnest(locked::text[]) AS l(workspace_id)
            WHERE l.workspace_id IN (SELECT workspace_id FROM fresh)
               OR l.workspace_id NOT IN (SELECT workspace_id FROM candidates))
    INTO out_runs, out_held, out_taken, out_keeps, served_ids
    FROM leased c;
    -- The fresh runs (a run taken over was 'running' already) added to shard 0 of
    -- their workspace's count and of their agent's, here under the lock of step a
    -- (agentrun.claim_counts keeps the row trigger from counting them again). On
    -- Citus the trigger fires on the worker, which does not see the setting: the
    -- distribution step turns it off for this function, and the trigger counts.
    IF current_setting('agentrun.claim_counts', true) = 'on' THEN
        INSERT INTO workspace_running_counts AS c (workspace_id, shard, n)
        SELECT (out_runs[i]).workspace_id, 0, count(*)
        FROM generate_subscripts(out_runs, 1) i
        WHERE NOT out_taken[i]
        GROUP BY 1
        ORDER BY 1
        ON CONFLICT (workspace_id, shard) DO UPDATE SET n = c.n + excluded.n;
        INSERT INTO agent_running_counts AS c (workspace_id, agent_id, shard, n)
        SELECT (out_runs[i]).workspace_id, (out_runs[i]).agent_id, 0, count(*)
        FROM generate_subscripts(out_runs, 1) i
        WHERE NOT out_taken[i]
        GROUP BY 1, 2
        ORDER BY 1, 2
        ON CONFLICT (workspace_id, agent_id, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    -- metered: the workspace has a credit account (control_plane/credits/claims.py).
    IF out_runs IS NOT NULL THEN
        SELECT array_agg(a.workspace_id) INTO metered_ids FROM credit_accounts a
        WHERE a.workspace_id = ANY(locked);
    END IF;
    RETURN QUERY SELECT out_runs[i], out_held[i], out_taken[i], out_keeps[i],
                        coalesce((out_runs[i]).workspace_id = ANY(metered_ids), false),
                        (out_runs[i]).workspace_id, NULL::boolean, NULL::boolean
                 FROM generate_subscripts(out_runs, 1) i;
    -- Each locked workspace: whether it was served, and whether the claim may
    -- have emptied it (it got fewer runs than its room, at least one, and kept
    -- no due run it read: its next_wake_at is raised from its runs). A
    -- workspace at its cap or paused is raised too: to its first lease end if
    -- it has nothing due, so that it takes no turn until then.
    RETURN QUERY
        SELECT NULL::runs, NULL::double precision, NULL::boolean, NULL::boolean, NULL::boolean,
               t.workspace_id, t.workspace_id = ANY(coalesce(served_ids, '{}')),
               greatest(t.room, 1) > (SELECT count(*) FROM unnest(out_runs) g
                                      WHERE g.workspace_id = t.workspace_id)
               AND NOT EXISTS (SELECT 1 FROM generate_subscripts(out_runs, 1) i
                               WHERE (out_runs[i]).workspace_id = t.workspace_id AND out_keeps[i])
        FROM unnest(locked, rooms) AS t(workspace_id, room)
        UNION ALL
        SELECT NULL, NULL, NULL, NULL, NULL, g.workspace_id, true, true
        FROM unnest(gone) AS g(workspace_id);
END
$claim$;
$function$, '/* the agent''s due runs */',
        CASE WHEN current_setting('server_version_num')::int >= 180000
                  AND current_setting('agentrun.claim_walk', true) IS DISTINCT FROM 'levels'
             THEN skip_scan ELSE levels END);
END
$claim_walk$;

-- The shard a workspace's rows are on: 0 on plain PostgreSQL; on Citus the
-- distribution step (control_plane/store/citus.py) makes it the shard of
-- `runs` that holds the workspace, so the claim runs its lease step once per
-- shard.
CREATE FUNCTION agentrun_shard_of(ws text) RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT 0::bigint $$;

-- agentrun_claim(): the claim as run_claim calls it (section 7): the turns
-- taken here, the lease step on each shard holding one of them
-- (agentrun_claim_shard), the turns marked and the emptied ones raised here.
CREATE FUNCTION agentrun_claim(
    owners text[], lease_seconds double precision, at timestamptz, scope text[],
    carried jsonb, continued text[], own_release text, live_seconds double precision,
    gated boolean)
RETURNS TABLE (run runs, held_seconds double precision, taken_over boolean, keeps_due boolean,
               others_due boolean, metered boolean)
LANGUAGE plpgsql VOLATILE
AS $claim$
#variable_conflict use_column
DECLARE
    claim_clock timestamptz := coalesce($3, now());
    expected text[];
    taken text[] := '{}';
    turn_ids text[];
    turn_shards bigint[];
    shard_ids text[];
    left_owners text[] := $1;
    round_limit integer;
    rounds integer := 0;
    budget integer;
    ws_left integer;
    s record;
    shard_runs runs[];
    shard_held double precision[];
    shard_taken boolean[];
    shard_keeps boolean[];
    shard_metered boolean[];
    shard_served text[];
    shard_empty text[];
    out_runs runs[] := '{}';
    out_held double precision[] := '{}';
    out_taken boolean[] := '{}';
    out_keeps boolean[] := '{}';
    out_metered boolean[] := '{}';
    served_ids text[] := '{}';
    maybe_empty text[] := '{}';
    locked text[];
    raised_ids text[];
    raised_wakes timestamptz[];
    pending text[];
    wake_ids text[];
    wake_ats timestamptz[];
    folded text[];
BEGIN
    -- 0. Fold the due wakes lowered on the shards (workspace_wakes, under Citus;
    -- plain PostgreSQL lowers workspace_turns itself and has none): an unlocked
    -- read of every shard, then each turn row no other claimer holds lowered,
    -- and on each shard the rows folded deleted unless a writer holds or
    -- changed them (they are folded again by a later claim: a lower bound).
    SELECT array_agg(w.workspace_id), array_agg(w.wake_at) INTO wake_ids, wake_ats
    FROM workspace_wakes w WHERE w.wake_at <= claim_clock;
    IF wake_ids IS NOT NULL THEN
        INSERT INTO workspace_turns (workspace_id, next_wake_at)
        SELECT * FROM unnest(wake_ids, wake_ats) ON CONFLICT (workspace_id) DO NOTHING;
        SELECT array_agg(l.workspace_id) INTO folded FROM (
            SELECT t.workspace_id FROM workspace_turns t
            WHERE t.workspace_id = ANY(wake_ids)
            ORDER BY t.workspace_id
            FOR NO KEY UPDATE SKIP LOCKED
        ) l;
        UPDATE workspace_turns t SET next_wake_at = f.wake_at
        FROM unnest(wake_ids, wake_ats) AS f(workspace_id, wake_at)
        WHERE t.workspace_id = f.workspace_id AND t.workspace_id = ANY(folded)
          AND (t.next_wake_at IS NULL OR t.next_wake_at > f.wake_at);
        FOR s IN
            SELECT array_agg(f.workspace_id) AS ids, array_agg(f.wake_at) AS wakes
            FROM unnest(wake_ids, wake_ats) AS f(workspace_id, wake_at)
            WHERE f.workspace_id = ANY(folded)
            GROUP BY agentrun_shard_of(f.workspace_id)
        LOOP
            WITH held AS (
                SELECT w.workspace_id, w.wake_at FROM workspace_wakes w
                WHERE w.workspace_id = ANY(s.ids)
                FOR UPDATE SKIP LOCKED
            )
            DELETE FROM workspace_wakes w
            USING held h, unnest(s.ids, s.wakes) AS f(workspace_id, wake_at)
            WHERE w.workspace_id = ANY(s.ids) AND w.workspace_id = h.workspace_id
              AND h.workspace_id = f.workspace_id AND h.wake_at = f.wake_at;
        END LOOP;
    END IF;
    -- Step 1's turns, read without its lock (others_due, below).
    SELECT array_agg(t.workspace_id) INTO expected FROM (
        SELECT t.workspace_id FROM workspace_turns t
        WHERE t.next_wake_at <= claim_clock AND ($4 IS NULL OR t.workspace_id = ANY($4))
        ORDER BY t.last_served_at, t.workspace_id
        LIMIT cardinality($1)
    ) t;
    LOOP
        rounds := rounds + 1;
        round_limit := cardinality(left_owners);
        -- 1. Take turns: lock the workspaces whose turn it is, least recently
        -- served first, one per owner left.
        SELECT array_agg(t.workspace_id ORDER BY t.last_served_at, t.workspace_id),
               array_agg(agentrun_shard_of(t.workspace_id)
                         ORDER BY t.last_served_at, t.workspace_id)
        INTO turn_ids, turn_shards
        FROM (
            SELECT t.workspace_id, t.last_served_at FROM workspace_turns t
            WHERE t.next_wake_at <= claim_clock AND ($4 IS NULL OR t.workspace_id = ANY($4))
              AND t.workspace_id <> ALL(taken)
            ORDER BY t.last_served_at, t.workspace_id
            LIMIT round_limit
            FOR NO KEY UPDATE SKIP LOCKED
        ) t;
        EXIT WHEN turn_ids IS NULL;
        taken := taken || turn_ids;
        ws_left := cardinality(turn_ids);
        -- 2. The lease step on each shard holding a turn, in the order of its
        -- first turn, with a share of the owners left as large as its share of
        -- the turns left (one shard: all of them).
        FOR s IN
            SELECT u.shard, array_agg(u.workspace_id ORDER BY u.ord) AS ids
            FROM unnest(turn_ids, turn_shards) WITH ORDINALITY AS u(workspace_id, shard, ord)
            GROUP BY u.shard ORDER BY min(u.ord)
        LOOP
            EXIT WHEN coalesce(cardinality(left_owners), 0) = 0;
            budget := ceil(cardinality(left_owners) * cardinality(s.ids)::numeric / ws_left);
            ws_left := ws_left - cardinality(s.ids);
            SELECT coalesce(array_agg(c.run ORDER BY c.ord) FILTER (WHERE c.served IS NULL), '{}'),
                   array_agg(c.held_seconds ORDER BY c.ord) FILTER (WHERE c.served IS NULL),
                   array_agg(c.taken_over ORDER BY c.ord) FILTER (WHERE c.served IS NULL),
                   array_agg(c.keeps_due ORDER BY c.ord) FILTER (WHERE c.served IS NULL),
                   array_agg(c.metered ORDER BY c.ord) FILTER (WHERE c.served IS NULL),
                   array_agg(c.workspace_id) FILTER (WHERE c.served),
                   array_agg(c.workspace_id) FILTER (WHERE c.maybe_empty)
            INTO shard_runs, shard_held, shard_taken, shard_keeps, shard_metered, shard_served,
                 shard_empty
            FROM agentrun_claim_shard(left_owners[1:budget], $2, claim_clock, s.ids,
                                      $5, $6, $7, $8, $9)
                 WITH ORDINALITY AS c(run, held_seconds, taken_over, keeps_due, metered,
                                      workspace_id, served, maybe_empty, ord);
            out_runs := out_runs || shard_runs;
            out_held := out_held || shard_held;
            out_taken := out_taken || shard_taken;
            out_keeps := out_keeps || shard_keeps;
            out_metered := out_metered || shard_metered;
            served_ids := served_ids || shard_served;
            maybe_empty := maybe_empty || shard_empty;
            left_owners := left_owners[cardinality(shard_runs) + 1:];
        END LOOP;
        -- Another round while owners are left and this one's turns filled its
        -- limit: the workspaces whose turns it took gave fewer runs than owners
        -- (emptied, at their caps, paused, or with nothing these owners can run),
        -- and the next in line may have runs. At most four rounds.
        EXIT WHEN coalesce(cardinality(left_owners), 0) = 0 OR rounds >= 4
               OR cardinality(turn_ids) < round_limit;
    END LOOP;
    -- 3. Mark the served turns (to the back of the line).
    UPDATE workspace_turns t SET last_served_at = claim_clock
    WHERE t.workspace_id = ANY(served_ids);
    -- 4. Raise next_wake_at of the workspaces the claim may have emptied: lock
    -- those no admission or wake-up holds (KEY SHARE, workspace_lower_next_wake),
    -- then, a new statement, read their earliest wake: a queued or waiting run's
    -- (none while the queue is paused) or a lease's end (a lapsed lease is taken
    -- over at its workspace's turn). NULL: nothing.
    IF cardinality(maybe_empty) > 0 THEN
        SELECT array_agg(l.workspace_id) INTO locked FROM (
            SELECT t.workspace_id FROM workspace_turns t
            WHERE t.workspace_id = ANY(maybe_empty)
            ORDER BY t.workspace_id
            FOR UPDATE SKIP LOCKED
        ) l;
    END IF;
    IF locked IS NOT NULL THEN
        SELECT array_agg(w.workspace_id), array_agg(least(
                   CASE WHEN NOT w.queue_paused THEN (
                       SELECT min(first.wake_at)
                       FROM agents a
                       CROSS JOIN LATERAL (
                           SELECT r.wake_at FROM runs r
                           WHERE r.workspace_id = a.workspace_id AND r.agent_id = a.agent_id
                             AND r.status IN ('queued', 'waiting') AND r.wake_at IS NOT NULL
                           ORDER BY r.wake_at
                           LIMIT 1
                       ) first
                       WHERE a.workspace_id = w.workspace_id) END,
                   (SELECT r.wake_at FROM runs r
                    WHERE r.workspace_id = w.workspace_id AND r.status = 'running'
                    ORDER BY r.wake_at LIMIT 1)))
        INTO raised_ids, raised_wakes
        FROM workspaces w
        WHERE w.workspace_id = ANY(locked);
        UPDATE workspace_turns t SET next_wake_at = v.wake
        FROM (SELECT l.workspace_id, x.wake
              FROM unnest(locked) AS l(workspace_id)
              LEFT JOIN unnest(raised_ids, raised_wakes) AS x(workspace_id, wake)
                  USING (workspace_id)) v
        WHERE t.workspace_id = v.workspace_id;
    END IF;
    RETURN QUERY SELECT out_runs[i], out_held[i], out_taken[i], out_keeps[i], false, out_metered[i]
                 FROM generate_subscripts(out_runs, 1) i;
    -- others_due: a workspace of that read left unserved, still due, with room
    -- and its queue open: another claimer held it (0031).
    IF cardinality(out_runs) < cardinality($1) THEN
        SELECT array_agg(t.workspace_id) INTO pending FROM workspace_turns t
        WHERE t.workspace_id = ANY(expected)
          AND t.last_served_at IS DISTINCT FROM claim_clock
          AND t.next_wake_at <= claim_clock;
        IF pending IS NOT NULL AND EXISTS (
            SELECT 1 FROM workspaces w
            WHERE w.workspace_id = ANY(pending) AND NOT w.queue_paused
              AND (SELECT coalesce(sum(n), 0) FROM workspace_running_counts c
                   WHERE c.workspace_id = w.workspace_id) < w.max_concurrency
        ) THEN
            RETURN QUERY SELECT NULL::runs, NULL::double precision, NULL::boolean,
                                NULL::boolean, true, NULL::boolean;
        END IF;
    END IF;
END
$claim$;
