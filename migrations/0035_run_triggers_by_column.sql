-- The two row triggers that watch a run's status and wake time are considered
-- only by the updates that set those columns (issue 16).
--
-- Postgres prepares a row trigger's WHEN clause (and every CHECK constraint)
-- anew for each statement that updates the table, before it tests the row.
-- runs_active_time's WHEN reads only status, and runs_fair_update's only
-- status and wake_at (and a setting), yet both were prepared by every update
-- of a run: a step commit, a heartbeat, a renewal. A trigger declared UPDATE
-- OF those columns is skipped outright, WHEN and all, by an update whose SET
-- list names none of them, which cannot change them: no BEFORE trigger on
-- runs writes status or wake_at (runs_active_time writes active_seconds and
-- held_since). Every update that does change them sets them, so each trigger
-- fires exactly when it did.
--
-- The step commit that keeps the lease as it is (run_commit_keep,
-- control_plane/store/sql/steps.sql) now names neither column. Measured, that
-- statement (before: it also set wake_at, renewing when due) alternated on
-- databases before and after this migration, one held run each, 3,000 commits
-- a side, twice: 0.423 -> 0.368 and 0.545 -> 0.470 ms; the new statement with
-- the triggers as they were, 0.398 and 0.516.

DROP TRIGGER runs_active_time ON runs;
CREATE TRIGGER runs_active_time BEFORE UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION runs_count_active_time();

DROP TRIGGER runs_fair_update ON runs;
CREATE TRIGGER runs_fair_update AFTER UPDATE OF status, wake_at ON runs FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           OR (NEW.status IN ('queued', 'waiting') AND NEW.wake_at IS DISTINCT FROM OLD.wake_at))
          AND NOT (NEW.status = 'running' AND OLD.status IS DISTINCT FROM 'running'
                   AND coalesce(current_setting('agentrun.claim_counts', true), '') = 'on'))
    EXECUTE FUNCTION runs_fair_on_update();
