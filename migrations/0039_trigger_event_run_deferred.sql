-- A trigger event's run is checked at commit, not at the end of the statement (issue 50).
--
-- trigger_event_admit writes the event and then admits its run in one statement, so the
-- event's row names a run that a later CTE of the same statement inserts. PostgreSQL
-- checks the foreign key at the statement's end, when the run is there. A Citus
-- coordinator runs such a statement as several (each writing CTE on its own), and the
-- event's insert then failed its check before the run existed: no webhook, schedule or
-- mail event could start a run on a cluster. Checked at commit, the key holds the same
-- rows on both. Citus cannot ALTER a constraint's timing, hence drop and add.

ALTER TABLE trigger_events DROP CONSTRAINT trigger_events_workspace_id_run_id_fkey;

ALTER TABLE trigger_events ADD CONSTRAINT trigger_events_workspace_id_run_id_fkey
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs (workspace_id, run_id)
    DEFERRABLE INITIALLY DEFERRED;
