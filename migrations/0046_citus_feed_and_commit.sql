-- The feed's admission trigger in a shape Citus runs (issue 50).
--
-- runs_feed_insert (0043) inserted into workspace_events with INSERT ... SELECT
-- FROM its transition table `inserted`. On a Citus worker the trigger fires on
-- the shard, and Citus plans that INSERT as a distributed INSERT ... SELECT,
-- whose executor cannot see the trigger's transition table ("executor could not
-- find named tuplestore"): every admission failed on a cluster. The rows are now
-- read from `inserted` by a plain local query into arrays, and inserted from
-- unnest() of those, which Citus routes row by row to the shard of each
-- workspace (the same shard the run is on). On one PostgreSQL it inserts the same
-- rows in the same order, one statement as before.
CREATE OR REPLACE FUNCTION workspace_events_runs_created() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ws text[];
    ids text[];
    details jsonb[];
BEGIN
    -- Read the transition table locally (Citus cannot hand it to a distributed insert).
    SELECT array_agg(workspace_id), array_agg(run_id::text),
           array_agg(jsonb_build_object('agent_id', agent_id, 'status', status))
      INTO ws, ids, details
      FROM inserted;
    INSERT INTO workspace_events (workspace_id, kind, object_id, detail)
    SELECT w, 'run.created', o, d FROM unnest(ws, ids, details) AS t(w, o, d);
    RETURN NULL;
END $$;

-- release_share() in PL/pgSQL. As an SQL function, Citus refuses every call of it
-- ("parameterized queries for SQL functions referencing distributed tables are not
-- supported": its statement reads the reference table releases with the function's
-- arguments as parameters), so neither the fast path's lease nor the claim could
-- route by release on a cluster. Same arguments, same one row, on one PostgreSQL too.
CREATE OR REPLACE FUNCTION release_share(own text, live double precision, gated boolean)
RETURNS TABLE (lo integer, hi integer, reads_from integer, writes integer) LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- PL/pgSQL, not SQL: Citus plans no SQL function's statement over its tables (here the
    -- reference table releases) with parameters, wherever it is called from.
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
        SELECT o.release FROM open o WHERE o.ramp_percent IS NULL
        ORDER BY o.since DESC, o.release DESC LIMIT 1
    ), ramp AS (
        SELECT o.release, o.ramp_percent FROM open o WHERE o.ramp_percent IS NOT NULL
        ORDER BY o.since DESC, o.release DESC LIMIT 1
    )
    SELECT CASE WHEN own = (SELECT m.release FROM main m)
                THEN coalesce((SELECT r.ramp_percent FROM ramp r), 0) ELSE 0 END,
           CASE WHEN own = (SELECT m.release FROM main m) THEN 100
                WHEN own = (SELECT r.release FROM ramp r)
                THEN CASE WHEN EXISTS (SELECT 1 FROM main) THEN (SELECT r.ramp_percent FROM ramp r)
                          ELSE 100 END
                ELSE 0 END,
           coalesce((SELECT rl.log_reads_from FROM releases rl WHERE rl.release = own), 0),
           coalesce((SELECT rl.log_version FROM releases rl WHERE rl.release = own), 2147483647);
END $$;
