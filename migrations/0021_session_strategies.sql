-- Session strategies (issue 17, item 4; LangGraph's multitask strategies): what a message sent
-- while the session's previous turn still runs does. Chosen per session (sessions.strategy)
-- and overridable per message (control_plane/api/sessions.py):
--
-- * reject    refused with ABORTED / HTTP 409 (the default, as before);
-- * enqueue   the turn is admitted at once but parked (status 'waiting', wait_reason
--             'session', no wake_at): the trigger below wakes it when the turn before it
--             ends, in the very transaction that ends that turn's run, exactly once;
-- * interrupt the running turn's run is cancelled (run_cancel: its executor is fenced at its
--             next commit) and the new turn starts with the transcript so far, the
--             interrupted turn's committed decisions and tool results included;
-- * rollback  as interrupt, but the cancelled turn is left out of every later transcript.
--
-- Why exactly once. A run reaches a terminal status once, and the trigger fires on that one
-- transition whatever statement makes it (commit, cancel, deadline, max age). It wakes only
-- the session's first unfinished turn, and only while that turn's run is still parked
-- (waiting, reason 'session', no wake_at yet). A send racing the end of a turn holds the
-- session row and then share locks on the runs of every unfinished turn
-- (session_unfinished_lock): the ending transaction holds its run's row until it commits, so
-- either the send sees that turn ended (and admits its own turn queued if none is left), or
-- the ending transaction's trigger sees the parked turn (and wakes it).
ALTER TABLE sessions ADD COLUMN strategy text NOT NULL DEFAULT 'reject'
    CONSTRAINT session_strategy_known
    CHECK (strategy IN ('reject', 'enqueue', 'interrupt', 'rollback'));

-- Why a turn ended early: 'interrupt' (its committed steps stay in the transcript) or
-- 'rollback' (the turn is left out of the transcript).
ALTER TABLE session_turns ADD COLUMN ended_by text
    CONSTRAINT session_turn_ended_by_known CHECK (ended_by IN ('interrupt', 'rollback'));

-- The transcript a session's turn `before_turn` carries: each earlier turn (at most the last
-- 100, and whole turns dropped from the oldest to keep it within 256 KiB) as its user message,
-- then the answer of a completed turn, or the committed decisions and tool results of an
-- interrupted one. Rolled-back turns are left out.
CREATE FUNCTION session_transcript(ws text, sid uuid, before_turn integer) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    WITH turns AS (
        SELECT t.turn, t.run_id, t.ended_by, r.status, r.input, r.output
        FROM session_turns t
        JOIN runs r ON r.workspace_id = t.workspace_id AND r.run_id = t.run_id
        WHERE t.workspace_id = ws AND t.session_id = sid AND t.turn < before_turn
          AND t.ended_by IS DISTINCT FROM 'rollback'
        ORDER BY t.turn DESC
        LIMIT 100
    ), messages AS (
        SELECT tu.turn, 0 AS seq, jsonb_build_object('role', 'user', 'content', tu.input) AS m
        FROM turns tu
        UNION ALL
        SELECT tu.turn, 1, jsonb_build_object('role', 'assistant', 'content', tu.output)
        FROM turns tu WHERE tu.status = 'completed' AND coalesce(tu.output, '') <> ''
        UNION ALL
        SELECT tu.turn, 1 + s.seq, jsonb_build_object('role', 'assistant', 'content',
            CASE WHEN s.kind = 'model_decision' THEN s.payload ->> 'content'
                 ELSE '[' || coalesce(s.payload ->> 'tool', 'tool') || ' returned] '
                      || coalesce(s.payload ->> 'output', s.payload ->> 'error', '') END)
        FROM turns tu
        JOIN steps s ON s.workspace_id = ws AND s.run_id = tu.run_id
        WHERE tu.ended_by = 'interrupt' AND s.kind IN ('model_decision', 'tool_result')
          AND coalesce(s.payload ->> 'content', s.payload ->> 'output', '') <> ''
    ), sized AS (
        SELECT turn, sum(octet_length(m::text)) AS bytes FROM messages GROUP BY turn
    ), kept AS (
        SELECT turn FROM (
            SELECT turn, sum(bytes) OVER (ORDER BY turn DESC) AS total FROM sized
        ) x WHERE total <= 256 * 1024
    )
    SELECT coalesce(jsonb_agg(m ORDER BY turn, seq), '[]'::jsonb)
    FROM messages WHERE turn IN (SELECT turn FROM kept)
$$;

-- Wake the session's first unfinished turn, if it is parked waiting for the turns before it
-- (a run of the session `rid` answered just ended): its input step (never read yet: the run
-- was never claimed) gets the transcript as of now. The first unfinished turn, not merely the
-- next one: a parked turn cancelled by CancelRun ends too, and must neither wake the turn
-- after it while an earlier one still runs nor leave that turn parked for ever.
CREATE FUNCTION session_start_next(ws text, rid uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    sid uuid;
    nxt record;
BEGIN
    SELECT session_id INTO sid FROM session_turns WHERE workspace_id = ws AND run_id = rid;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT t.turn, t.run_id, r.status, r.wait_reason, r.wake_at INTO nxt FROM session_turns t
    JOIN runs r ON r.workspace_id = t.workspace_id AND r.run_id = t.run_id
    WHERE t.workspace_id = ws AND t.session_id = sid
      AND r.status IN ('queued', 'running', 'waiting')
    ORDER BY t.turn
    LIMIT 1
    FOR NO KEY UPDATE OF r;
    IF NOT FOUND OR nxt.status <> 'waiting' OR nxt.wait_reason <> 'session'
       OR nxt.wake_at IS NOT NULL THEN
        RETURN false;
    END IF;
    UPDATE steps SET payload = jsonb_set(payload, '{history}',
                                         session_transcript(ws, sid, nxt.turn))
    WHERE workspace_id = ws AND run_id = nxt.run_id AND seq = 0 AND kind = 'input';
    UPDATE runs SET wake_at = now(), updated_at = now()
    WHERE workspace_id = ws AND run_id = nxt.run_id;
    RETURN true;
END $$;

CREATE FUNCTION runs_session_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM session_start_next(NEW.workspace_id, NEW.run_id);
    RETURN NULL;
END $$;

CREATE TRIGGER runs_session_finish AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_session_on_finish();
