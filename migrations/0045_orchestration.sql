-- Orchestration controls (issue 45): tags and metadata on runs, and pause.
--
-- Tags (a few slugs) and metadata (a small JSON object) are set at admission
-- and by the run's own `set_metadata` calls: that call's ok tool_result step
-- carries the run's whole new metadata and tags, and the trigger below copies
-- them onto the run in the transaction that commits the step, so the run row
-- always says what its log says (a replayed run reads the step, nothing runs
-- again). ListRuns filters by tag through a GIN index that holds only tagged
-- runs, and by a metadata key=value (containment, on the rows the other
-- filters leave).
--
-- Pause: a paused run, a paused agent and a workspace whose queue is paused
-- are skipped by the claim. A paused run that is running is asked to hand
-- itself back at its next step boundary (control_plane/api/pause.py); once
-- parked it holds no executor and stays parked until resumed. A paused
-- agent counts as an agent with no room; a paused queue gets no turn. A
-- paused run's lapsed lease is not taken over until it is resumed.

ALTER TABLE runs ADD COLUMN tags text[] NOT NULL DEFAULT '{}';
ALTER TABLE runs ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}'
    CONSTRAINT run_metadata_object CHECK (jsonb_typeof(metadata) = 'object');
ALTER TABLE runs ADD COLUMN paused boolean NOT NULL DEFAULT false;
ALTER TABLE agents ADD COLUMN paused boolean NOT NULL DEFAULT false;
ALTER TABLE workspaces ADD COLUMN queue_paused boolean NOT NULL DEFAULT false;

-- ListRuns(tag): only tagged runs are in it (most runs carry none).
CREATE INDEX runs_by_tag ON runs USING gin (tags) WHERE tags <> '{}';

-- A set_metadata call's ok result sets the run's metadata and tags (its output
-- holds both whole, as the executor computed them from the log).
CREATE FUNCTION runs_metadata_on_step() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs r SET
        metadata = CASE WHEN jsonb_typeof(NEW.payload -> 'output' -> 'metadata') = 'object'
                        THEN NEW.payload -> 'output' -> 'metadata' ELSE r.metadata END,
        tags = CASE WHEN jsonb_typeof(NEW.payload -> 'output' -> 'tags') = 'array'
                    THEN ARRAY(SELECT jsonb_array_elements_text(NEW.payload -> 'output' -> 'tags'))
                    ELSE r.tags END
    WHERE r.workspace_id = NEW.workspace_id AND r.run_id = NEW.run_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER steps_set_metadata AFTER INSERT ON steps FOR EACH ROW
    WHEN (NEW.kind = 'tool_result' AND NEW.payload ->> 'tool' = 'set_metadata'
          AND NEW.payload ->> 'status' = 'ok')
    EXECUTE FUNCTION runs_metadata_on_step();

-- The claim as 0037 made it, skipping paused runs, paused agents and paused
-- workspace queues.
DO $claim_walk$
DECLARE
    -- Before Postgres 18: the walk over priority levels.
    levels constant text := $levels$
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
                  AND NOT r.paused
                  AND ((SELECT any_release FROM routing) OR r.release = ANY($6::text[])
                       OR (r.release IS NULL
                           AND release_takes(r.run_id, (SELECT lo FROM routing), (SELECT hi FROM routing))
                           AND r.log_version BETWEEN (SELECT reads_from FROM routing)
                                                 AND (SELECT writes FROM routing)))
                  AND ($5::jsonb IS NULL OR EXISTS (
                      SELECT 1 FROM agent_versions v
                      WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
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
                    AND v.version = r.agent_version
                    AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $5::jsonb))
            ORDER BY r.priority DESC, r.wake_at, r.run_id
            LIMIT q.runs
$skip_scan$;
BEGIN
    EXECUTE replace($function$
CREATE OR REPLACE FUNCTION agentrun_claim_uncounted(
    owners text[], lease_seconds double precision, at timestamptz, scope text[],
    carried jsonb, continued text[], own_release text, live_seconds double precision,
    gated boolean)
RETURNS TABLE (run runs, held_seconds double precision, taken_over boolean, keeps_due boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $claim$
-- The result's columns (run, held_seconds, taken_over, keeps_due) are variables
-- too: in the statements the names mean the columns they always meant.
#variable_conflict use_column
DECLARE
    turn_ids text[];
    turn_rooms bigint[];
    out_runs runs[];
    out_held double precision[];
    out_taken boolean[];
    out_keeps boolean[];
    maybe_empty text[];
    locked text[];
BEGIN
    -- 1. The workspaces whose turn it is, least recently served first, with
    -- their room under the cap (read before the lock: step 2 reads it again).
    SELECT array_agg(t.workspace_id), array_agg(t.room) INTO turn_ids, turn_rooms
    FROM (
        SELECT w.workspace_id, w.max_concurrency - c.running AS room
        FROM workspaces w
        CROSS JOIN LATERAL (
            SELECT coalesce(sum(n), 0) AS running FROM workspace_running_counts c
            WHERE c.workspace_id = w.workspace_id) c
        WHERE w.next_wake_at <= coalesce($3, now())
          AND c.running < w.max_concurrency
          AND NOT w.queue_paused
          AND ($4 IS NULL OR w.workspace_id = ANY($4))
        ORDER BY w.last_served_at, w.workspace_id
        LIMIT cardinality($1)
        FOR NO KEY UPDATE OF w SKIP LOCKED
    ) t;
    turn_ids := coalesce(turn_ids, '{}');
    -- 2. Lapsed leases first, then the turns' due runs, round robin, within
    -- each workspace's and agent's room (sql/lease.sql says how).
    WITH clock AS MATERIALIZED (
        SELECT coalesce($3::timestamptz, now()) AS now
    ), routing AS MATERIALIZED (
        -- The share of the runs on no release that these owners take (release_share).
        SELECT $6::text[] IS NULL AS any_release, s.lo, s.hi, s.reads_from, s.writes
        FROM release_share($7, $8, $9) s
    ), lapsed AS (
        SELECT r.workspace_id, r.run_id FROM runs r
        WHERE r.status = 'running' AND r.wake_at <= (SELECT now FROM clock) AND NOT r.paused
          AND ($4::text[] IS NULL OR r.workspace_id = ANY($4::text[]))
          AND ((SELECT any_release FROM routing) OR r.release = ANY($6::text[])
               OR (r.release IS NULL
                   AND release_takes(r.run_id, (SELECT lo FROM routing), (SELECT hi FROM routing))
                   AND r.log_version BETWEEN (SELECT reads_from FROM routing)
                                         AND (SELECT writes FROM routing)))
          AND ($5::jsonb IS NULL OR EXISTS (
              SELECT 1 FROM agent_versions v
              WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
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
        SELECT workspace_id, run_id, taken_over, row_number() OVER () AS slot,
               workspace_id IN (SELECT workspace_id FROM kept) AS keeps_due
        FROM (SELECT *, true AS taken_over FROM lapsed
              UNION ALL SELECT *, false FROM fresh) d
    ), served AS (
        -- A workspace that got a run, or had none it could take (all its agents
        -- at their caps), goes to the back of the line; one that lost out only
        -- to a full batch keeps its place.
        UPDATE workspaces w SET last_served_at = (SELECT now FROM clock)
        WHERE w.workspace_id = ANY(turn_ids::text[])
          AND (w.workspace_id IN (SELECT workspace_id FROM fresh)
               OR w.workspace_id NOT IN (SELECT workspace_id FROM candidates))
    ), leased AS (
        UPDATE runs r SET
            status = 'running',
            wait_reason = NULL,
            release = coalesce(r.release, $7::text),
            log_version = greatest(r.log_version, coalesce(
                (SELECT writes FROM routing WHERE $7::text IS NOT NULL), 0)),
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
        RETURNING r AS run, run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock)) AS held_seconds,
            due.taken_over, due.keeps_due
    )
    SELECT array_agg(c.run), array_agg(c.held_seconds), array_agg(c.taken_over),
           array_agg(c.keeps_due)
    INTO out_runs, out_held, out_taken, out_keeps
    FROM leased c;
    -- 3. and 4. The workspaces that got fewer runs than they had room for and
    -- kept no due run may be empty: raise their next_wake_at, skipping any an
    -- admission or wake-up still holds KEY SHARE on.
    SELECT array_agg(t.workspace_id) INTO maybe_empty
    FROM unnest(turn_ids, turn_rooms) AS t(workspace_id, room)
    WHERE t.room > (SELECT count(*) FROM unnest(out_runs) g WHERE g.workspace_id = t.workspace_id)
      AND t.workspace_id NOT IN (
          SELECT (out_runs[i]).workspace_id FROM generate_subscripts(out_runs, 1) i
          WHERE out_keeps[i]);
    IF maybe_empty IS NOT NULL THEN
        SELECT array_agg(l.workspace_id) INTO locked FROM (
            SELECT workspace_id FROM workspaces
            WHERE workspace_id = ANY(maybe_empty)
            ORDER BY workspace_id
            FOR UPDATE SKIP LOCKED
        ) l;
    END IF;
    IF locked IS NOT NULL THEN
        -- The earliest wake_at of each workspace's queued or waiting runs (NULL:
        -- none), one index probe per agent.
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
        WHERE w.workspace_id = ANY(locked);
    END IF;
    RETURN QUERY SELECT out_runs[i], out_held[i], out_taken[i], out_keeps[i]
                 FROM generate_subscripts(out_runs, 1) i;
END
$claim$;
$function$, '/* the agent''s due runs */',
        CASE WHEN current_setting('server_version_num')::int >= 180000
                  AND current_setting('agentrun.claim_walk', true) IS DISTINCT FROM 'levels'
             THEN skip_scan ELSE levels END);
END
$claim_walk$;
