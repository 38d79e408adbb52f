-- The workspace feed's xid is taken where the row is stored (issue 50). A reader serves the
-- events whose xid is below its snapshot's xmin, and the shard's worker evaluates that
-- xmin; but on a Citus coordinator an INSERT evaluates the column default,
-- pg_current_xact_id(), on the coordinator, so an event written through it carried the
-- coordinator's transaction id, from another counter than the worker's snapshot
-- (measured on the local cluster: xid 56191 stored, the shard's xmin 69909). The feed then
-- served events of transactions still open, or held back finished ones, and ordered them
-- by two unrelated counters. A BEFORE INSERT trigger sets it on the node that stores the
-- row: the same value on one PostgreSQL, the shard's own on Citus.
CREATE FUNCTION workspace_events_local_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.xid := pg_current_xact_id();
    RETURN NEW;
END $$;

CREATE TRIGGER workspace_events_local_xid BEFORE INSERT ON workspace_events
    FOR EACH ROW EXECUTE FUNCTION workspace_events_local_xid();
