-- Priority (issue 17 item 3): a run's priority moves it ahead within its workspace's fair
-- share, never past another workspace's turn. Set at admission (StartRun, a trigger or
-- schedule's priority) and never changed after; higher goes first, 0 is everyone's default.
ALTER TABLE runs ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT run_priority_range CHECK (priority BETWEEN -100 AND 100);

-- The claim's order within an agent's queue: highest priority, then oldest due. The claim
-- walks it one priority level at a time (sql/lease.sql run_claim_due), so each level is a
-- range probe that stops at its first run not yet due: runs parked on a later time (or on
-- no time) are never read, however many there are, and a level is one index descent.
-- runs_due (0003_fairness.sql) keeps its job: the earliest wake time of an agent's queue.
CREATE INDEX runs_due_by_priority ON runs (workspace_id, agent_id, priority DESC, wake_at, run_id)
    WHERE status IN ('queued', 'waiting');
