-- Child runs (issue 11, item 7): a run's `start_child` tool call admits another agent's run
-- and parks the parent as wait_reason 'child' with no wake_at; the child's end is the call's
-- result and wakes the parent.
--
-- Why exactly once, under kill -9 and concurrent commits. The child is admitted in the very
-- transaction that commits the parent's tool_started step and its park
-- (control_plane/children.py): the child does not exist until the parent waits, so it cannot
-- finish while the parent's commit is in flight, and a resent commit (same epoch and seqs) is
-- acknowledged as a duplicate before admitting anything, while the unique
-- (workspace, parent_run_id, parent_seq) stops a second child for one call whatever else
-- happens. A run reaches a terminal status once (terminal statuses are final), and the
-- trigger below fires on that one transition, whichever statement makes it (commit, cancel,
-- deadline, max age, a failed commit). In the same transaction it locks the parent row, and
-- only if the parent still waits on children appends the call's tool_result at the parent's
-- next seq, under the parent's last epoch, and sets wake_at = now(). A parked parent has no
-- holder, so no executor writes its log meanwhile; a stale holder is fenced (its status is no
-- longer 'running' at its epoch). The parent's executor, resuming, finds the result in its
-- log like any other: the step log stays the one source of truth, and nothing is delivered
-- beside it. A parent that ended meanwhile (cancelled, past its max age) gets nothing.
ALTER TABLE runs ADD COLUMN parent_run_id uuid, ADD COLUMN parent_seq integer;
CREATE UNIQUE INDEX runs_child_of ON runs (workspace_id, parent_run_id, parent_seq)
    WHERE parent_run_id IS NOT NULL;

-- Record a child call's outcome in its parent's log and wake the parent, if the parent still
-- waits on children and the call has no result yet. Returns whether it did.
CREATE FUNCTION run_deliver_child_result(
    ws text, parent uuid, call_seq integer, child uuid, outcome text, result jsonb, err text
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held record;
    started jsonb;
    next_seq integer;
BEGIN
    SELECT lease_epoch INTO held FROM runs
    WHERE workspace_id = ws AND run_id = parent AND status = 'waiting' AND wait_reason = 'child'
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM steps WHERE workspace_id = ws AND run_id = parent
               AND kind = 'tool_result' AND ref_seq = call_seq) THEN
        RETURN false;
    END IF;
    SELECT payload INTO started FROM steps
    WHERE workspace_id = ws AND run_id = parent AND seq = call_seq AND kind = 'tool_started';
    SELECT coalesce(max(seq), -1) + 1 INTO next_seq FROM steps
    WHERE workspace_id = ws AND run_id = parent;
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload)
    VALUES (ws, parent, next_seq, 'tool_result', held.lease_epoch, call_seq,
            jsonb_strip_nulls(jsonb_build_object(
                'call_id', started ->> 'call_id', 'tool', 'start_child',
                'status', CASE WHEN outcome = 'completed' THEN 'ok' ELSE 'error' END,
                'output', jsonb_build_object('child_run_id', child, 'status', outcome,
                                             'output', result),
                'error', CASE WHEN outcome <> 'completed' THEN coalesce(err, outcome) END)));
    UPDATE runs SET wake_at = now(), step_count = step_count + 1, updated_at = now()
    WHERE workspace_id = ws AND run_id = parent;
    RETURN true;
END $$;

CREATE FUNCTION runs_child_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM run_deliver_child_result(NEW.workspace_id, NEW.parent_run_id, NEW.parent_seq,
                                     NEW.run_id, NEW.status, to_jsonb(NEW.output), NEW.error);
    RETURN NULL;
END $$;

CREATE TRIGGER runs_child_finish AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.parent_run_id IS NOT NULL
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_child_on_finish();
