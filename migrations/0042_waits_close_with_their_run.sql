-- Approvals close with their run (issue 43).
--
-- Cancelling a run that waited for an approval left the approval pending: it stayed in
-- `approvals list`, the console inbox and agentrun_approvals_pending until it expired,
-- and a decision on it was refused with a confusing "run is cancelled". Now the update
-- that ends a waiting run (cancel, max age, a failure, any path) closes its pending
-- approvals in the same transaction: decision 'closed', decided by `system:run`, the
-- reason naming how the run ended ("run cancelled: ..."). A later decision is refused
-- naming that. A trigger, like the other runs_*_finish triggers, so that no terminal
-- path is missed; it fires only for runs that were waiting, never on the hot path of a
-- held run's completion, and writes only the run's own workspace's rows (co-located).
ALTER TABLE approvals DROP CONSTRAINT approvals_decision_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_decision_check
    CHECK (decision IN ('approved', 'rejected', 'edited', 'expired', 'closed'));

CREATE FUNCTION runs_close_approvals_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Closed when the run finished: its finished_at (the statement's clock, fixed or not).
    UPDATE approvals SET decision = 'closed', decided_by = 'system:run',
                         decided_at = NEW.finished_at,
                         reason = 'run ' || NEW.status || coalesce(': ' || NEW.error, '')
    WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id AND decision IS NULL;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_close_approvals AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status = 'waiting' AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_close_approvals_on_finish();
