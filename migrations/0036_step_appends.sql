-- One definition of a step append for the database's own writers, as the named queries
-- have one (the steps_append fragment, control_plane/store/sql/steps.sql).
--
-- Two plpgsql functions append to a parked run's log themselves: a child's end delivers its
-- result to the parent (0013, from a trigger and from child_refused) and a signal answers a
-- wait_for_signal call (0016). Each repeated the same three writes: the call's tool_result
-- at the run's next seq under its last epoch, the step counted into runs.step_count (0011:
-- whoever inserts a step counts it), and wake_at = now(). They now both call
-- run_deliver_result; their locks and checks are unchanged (a signal is now marked consumed
-- just after the run is woken instead of just before, in the same transaction), so 0013's
-- and 0016's exactly-once arguments hold as written. run_next_seq is the "next seq" rule
-- that the named queries appending a step where the log ends share with it: finish steps,
-- decisions and stop steps, none on the commit path, so the function call costs nothing that
-- matters. Its callers hold the run row's lock, so no other step can take that seq.
--
-- Why the named queries do not call a function too: the fenced commits (run_commit,
-- run_commit_keep, run_commit_many) are the hottest statements, and appending their steps
-- through a function measured 12 to 30 us slower per commit in three runs (run_commit_keep,
-- one step, 4,000 commits a side in alternating blocks, p50: 243 us as it was, 243 through
-- the fragment, 260 through a SQL function, 256 through a plpgsql one with
-- synchronous_commit off; 435, 439, 460 and 457 us with it on).

CREATE FUNCTION run_next_seq(ws text, rid uuid) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT (SELECT coalesce(max(seq), -1) + 1 FROM steps WHERE workspace_id = ws AND run_id = rid)
$$;

-- Append the result of the call at `call_seq` to a parked run's log, under `held_epoch` (the
-- run's last), at its next seq; count it and make the run runnable now. Returns the seq.
-- The caller holds the run row's lock and has checked that the call has no result yet.
CREATE FUNCTION run_deliver_result(
    ws text, rid uuid, held_epoch bigint, call_seq integer, result jsonb
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    next_seq integer := run_next_seq(ws, rid);
BEGIN
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload)
    VALUES (ws, rid, next_seq, 'tool_result', held_epoch, call_seq, result);
    UPDATE runs SET wake_at = now(), step_count = step_count + 1, updated_at = now()
    WHERE workspace_id = ws AND run_id = rid;
    RETURN next_seq;
END $$;

-- 0013's function, its three writes now run_deliver_result's.
CREATE OR REPLACE FUNCTION run_deliver_child_result(
    ws text, parent uuid, call_seq integer, child uuid, outcome text, result jsonb, err text
) RETURNS boolean
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
            jsonb_strip_nulls(jsonb_build_object(
                'call_id', started ->> 'call_id', 'tool', 'start_child',
                'status', CASE WHEN outcome = 'completed' THEN 'ok' ELSE 'error' END,
                'output', jsonb_build_object('child_run_id', child, 'status', outcome,
                                             'output', result),
                'error', CASE WHEN outcome <> 'completed' THEN coalesce(err, outcome) END)));
    RETURN true;
END $$;

-- 0016's function, its three writes now run_deliver_result's (the signal is marked consumed
-- after them, as before in the same transaction).
CREATE OR REPLACE FUNCTION run_deliver_signal(ws text, rid uuid) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    held record;
    call record;
    sig record;
    answer_seq integer;
BEGIN
    SELECT lease_epoch INTO held FROM runs
    WHERE workspace_id = ws AND run_id = rid AND status = 'waiting' AND wait_reason = 'signal'
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- The open call: the last wait_for_signal started, with no result yet.
    SELECT s.seq, s.payload INTO call FROM steps s
    WHERE s.workspace_id = ws AND s.run_id = rid AND s.kind = 'tool_started'
      AND s.payload ->> 'tool' = 'wait_for_signal'
      AND NOT EXISTS (SELECT 1 FROM steps r WHERE r.workspace_id = ws AND r.run_id = rid
                      AND r.kind = 'tool_result' AND r.ref_seq = s.seq)
    ORDER BY s.seq DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT event_id, name, payload, created_at INTO sig FROM run_signals
    WHERE workspace_id = ws AND run_id = rid AND consumed_seq IS NULL
      AND name = call.payload -> 'arguments' ->> 'name'
    ORDER BY arrival LIMIT 1
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    answer_seq := run_deliver_result(ws, rid, held.lease_epoch, call.seq,
            jsonb_build_object(
                'call_id', call.payload ->> 'call_id', 'tool', 'wait_for_signal', 'status', 'ok',
                'output', jsonb_build_object('name', sig.name, 'event_id', sig.event_id,
                                             'payload', sig.payload, 'timed_out', false,
                                             'sent_at', sig.created_at)));
    UPDATE run_signals SET consumed_seq = call.seq, result_seq = answer_seq, consumed_at = now()
    WHERE workspace_id = ws AND run_id = rid AND event_id = sig.event_id;
    RETURN answer_seq;
END $$;
