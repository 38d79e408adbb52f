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
