-- Fan-out, fan-in and a parent-close policy (issue 45, item 1): one model decision starts
-- several child runs, which run in parallel under the caps, and the parent wakes once when
-- all, the first or n of them have ended; cancelling or failing the parent cancels the
-- children it asked to have cancelled, in the same transaction.
--
-- Several start_child calls of one decision are started in one commit (the executor
-- batches the ones that follow each other) and admitted in its transaction; each gets its
-- result as its child ends, and the parent wakes once the last of them has one.
--
-- A `start_children` call (control_plane/runs/children.py) parks its run as start_child's
-- does (wait_reason 'child') and admits every child of its list in that commit's
-- transaction, each marked with its parent, the call's seq and its place in the list
-- (parent_index); runs_child_of, now over the index too, stops a second set for one call
-- whatever is resent. Each child's end runs run_deliver_fan_in from the trigger 0013 made:
-- under the parent row's lock (which orders concurrent ends: the later one sees the
-- earlier one's status) it counts the call's ended children and, once enough have ended
-- and the call has no result yet, appends the call's one tool_result, every child's
-- outcome in list order, and wakes the parent, then cancels the children not waited for
-- whose policy is cancel. Their own ends run it again and find the result: nothing is
-- appended twice. A crash between a child's end and the parent's wake cannot happen: they
-- are one transaction.
--
-- Parent-close policy (runs.parent_close, per call: 'cancel' the default, 'abandon',
-- 'finish'; NULL on children admitted before this migration, which are left alone as
-- before). A parent that admitted a child to be cancelled is marked closes_children, and
-- the trigger runs_close_children, on that parent's one terminal transition (CancelRun,
-- bulk cancel, a failed commit, its deadline or max age, whichever statement makes it),
-- cancels each open such child as run_cancel (control_plane/store/sql/runs.sql) cancels a
-- run: status cancelled, no lease owner, its finish step at its next seq under its last
-- epoch. Its holder is fenced: its next commit or heartbeat finds the run no longer
-- running at its epoch. Each child is locked before its finish step takes the next seq, so
-- a commit racing it lands first or not at all (run_cancel retries such a collision
-- instead). A cancelled child with children of its own closes them the same way. The
-- WHEN clause reads only the row, so runs that never started a child pay no function call.
-- 'abandon' and 'finish' children keep running; a parent does not wait to close for
-- 'finish' ones (they run to completion, detached but recorded as its children).

ALTER TABLE runs ADD COLUMN parent_index integer,
    ADD COLUMN parent_close text
        CONSTRAINT run_parent_close_known CHECK (parent_close IN ('cancel', 'abandon', 'finish')),
    ADD COLUMN closes_children boolean NOT NULL DEFAULT false;

DROP INDEX runs_child_of;
CREATE UNIQUE INDEX runs_child_of ON runs (workspace_id, parent_run_id, parent_seq,
                                           coalesce(parent_index, -1))
    WHERE parent_run_id IS NOT NULL;

-- Cancel parent's open children whose policy is cancel (of the call at call_seq, or of
-- every call when it is NULL), each as run_cancel cancels a run. Returns how many.
CREATE FUNCTION run_cancel_children(ws text, parent uuid, call_seq integer, reason text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    kid record;
    n integer := 0;
BEGIN
    FOR kid IN
        SELECT run_id FROM runs
        WHERE workspace_id = ws AND parent_run_id = parent AND parent_close = 'cancel'
          AND (call_seq IS NULL OR parent_seq = call_seq)
          AND status IN ('queued', 'running', 'waiting')
        ORDER BY parent_seq, parent_index
        FOR NO KEY UPDATE
    LOOP
        UPDATE runs SET status = 'cancelled', wait_reason = NULL, wake_at = NULL,
                        lease_owner = NULL, error = reason, step_count = step_count + 1,
                        finished_at = now(), updated_at = now()
        WHERE workspace_id = ws AND run_id = kid.run_id
          AND status IN ('queued', 'running', 'waiting');
        IF FOUND THEN
            INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload)
            SELECT ws, kid.run_id, run_next_seq(ws, kid.run_id), 'finish', r.lease_epoch, NULL,
                   jsonb_build_object('status', 'cancelled', 'error', reason)
            FROM runs r WHERE r.workspace_id = ws AND r.run_id = kid.run_id;
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- The fan-in of the start_children call at call_seq: once enough of its children have
-- ended (all, the first, or n: the call's `wait`), its one tool_result with every child's
-- outcome in list order, the parent woken, and the children not waited for closed by
-- their policy. Returns whether it delivered.
CREATE FUNCTION run_deliver_fan_in(ws text, parent uuid, call_seq integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held record;
    started jsonb;
    mode text;
    total integer;
    ended integer;
    needed integer;
    outcomes jsonb;
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
    SELECT count(*), count(*) FILTER (WHERE status IN ('completed', 'failed', 'cancelled'))
    INTO total, ended FROM runs
    WHERE workspace_id = ws AND parent_run_id = parent AND parent_seq = call_seq
      AND parent_index IS NOT NULL;
    SELECT payload INTO started FROM steps
    WHERE workspace_id = ws AND run_id = parent AND seq = call_seq AND kind = 'tool_started';
    mode := coalesce(started -> 'arguments' ->> 'wait', 'all');
    needed := CASE mode
        WHEN 'first' THEN 1
        WHEN 'n' THEN least(coalesce((started -> 'arguments' ->> 'n')::integer, total), total)
        ELSE total END;
    IF total = 0 OR ended < needed THEN
        RETURN false;
    END IF;
    SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
               'index', r.parent_index, 'child_run_id', r.run_id, 'agent_id', r.agent_id,
               'status', CASE WHEN r.status IN ('completed', 'failed', 'cancelled') THEN r.status
                              WHEN r.parent_close = 'cancel' THEN 'cancelled'
                              ELSE r.status END,
               'output', r.output, 'error', r.error))
           ORDER BY r.parent_index)
    INTO outcomes FROM runs r
    WHERE r.workspace_id = ws AND r.parent_run_id = parent AND r.parent_seq = call_seq
      AND r.parent_index IS NOT NULL;
    PERFORM run_deliver_result(ws, parent, held.lease_epoch, call_seq,
            jsonb_build_object(
                'call_id', started ->> 'call_id', 'tool', 'start_children', 'status', 'ok',
                'output', jsonb_build_object('wait', mode, 'ended', ended,
                                             'children', outcomes)));
    PERFORM run_cancel_children(ws, parent, call_seq, 'not waited for: the parent went on');
    RETURN true;
END $$;

-- A start_children call that admitted nothing (an entry names no published agent, an
-- input out of bounds): its error result at once, and the parent woken.
CREATE FUNCTION run_deliver_fan_refused(ws text, parent uuid, call_seq integer, err text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held record;
    started jsonb;
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
    PERFORM run_deliver_result(ws, parent, held.lease_epoch, call_seq,
            jsonb_build_object('call_id', started ->> 'call_id', 'tool', 'start_children',
                               'status', 'error', 'error', err));
    RETURN true;
END $$;

-- 0036's function: several start_child calls of one decision may wait at once (the
-- executor starts the ones that follow each other together); each gets its result as its
-- child ends, but the parent wakes only once the last of them has one.
CREATE OR REPLACE FUNCTION run_deliver_child_result(
    ws text, parent uuid, call_seq integer, child uuid, outcome text, result jsonb, err text
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held record;
    started record;
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
    SELECT payload, ref_seq INTO started FROM steps
    WHERE workspace_id = ws AND run_id = parent AND seq = call_seq AND kind = 'tool_started';
    PERFORM run_deliver_result(ws, parent, held.lease_epoch, call_seq,
            jsonb_strip_nulls(jsonb_build_object(
                'call_id', started.payload ->> 'call_id', 'tool', 'start_child',
                'status', CASE WHEN outcome = 'completed' THEN 'ok' ELSE 'error' END,
                'output', jsonb_build_object('child_run_id', child, 'status', outcome,
                                             'output', result),
                'error', CASE WHEN outcome <> 'completed' THEN coalesce(err, outcome) END)));
    IF EXISTS (SELECT 1 FROM steps s
               WHERE s.workspace_id = ws AND s.run_id = parent AND s.kind = 'tool_started'
                 AND s.ref_seq = started.ref_seq AND s.payload ->> 'tool' = 'start_child'
                 AND NOT EXISTS (SELECT 1 FROM steps r
                                 WHERE r.workspace_id = ws AND r.run_id = parent
                                   AND r.kind = 'tool_result' AND r.ref_seq = s.seq)) THEN
        UPDATE runs SET wake_at = NULL WHERE workspace_id = ws AND run_id = parent;
    END IF;
    RETURN true;
END $$;

-- 0013's trigger function: a start_children child (parent_index set) goes to the fan-in.
CREATE OR REPLACE FUNCTION runs_child_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.parent_index IS NOT NULL THEN
        PERFORM run_deliver_fan_in(NEW.workspace_id, NEW.parent_run_id, NEW.parent_seq);
    ELSE
        PERFORM run_deliver_child_result(NEW.workspace_id, NEW.parent_run_id, NEW.parent_seq,
                                         NEW.run_id, NEW.status, to_jsonb(NEW.output),
                                         NEW.error);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION runs_close_children_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM run_cancel_children(NEW.workspace_id, NEW.run_id, NULL,
                                'parent run ' || NEW.status);
    RETURN NULL;
END $$;

CREATE TRIGGER runs_close_children AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.closes_children
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_close_children_on_finish();
