-- The claim's lease step (agentrun_claim_shard, 0047) answers at once when it locked no
-- workspace: every turn on its shard held by another claimer (SKIP LOCKED) or gone. On a
-- Citus coordinator its lease statement then locked runs `workspace_id = ANY('{}')`, which
-- Citus cannot route ("could not run distributed query with FOR UPDATE/SHARE commands"):
-- the claim failed whenever another claimer or a fast path held every workspace of one
-- shard's turns (test_claim_others_due on the cluster). Its answer is what the statement
-- gave then: a served, maybe-empty row for each gone workspace. The whole DO block again,
-- as 0047 wrote it, with that test before step b.

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
    -- None locked (every turn held by another claimer, or gone): nothing to lease.
    -- Citus cannot route the lease statement's locks over an empty array.
    IF cardinality(locked) = 0 THEN
        RETURN QUERY
            SELECT NULL::runs, NULL::double precision, NULL::boolean, NULL::boolean,
                   NULL::boolean, g.workspace_id, true, true
            FROM unnest(gone) AS g(workspace_id);
        RETURN;
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
