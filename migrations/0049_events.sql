-- Events by matching (issue 45, item 2): a workspace publishes named events with a JSON
-- object body and an id (RunService.PublishEvent, POST /v1/workspaces/{ws}/events,
-- `agentrun events publish`); a run's `wait_for_event` call waits for the next event of a
-- name whose body matches an expression over the body and the run's input
-- (`event.customer == run.input.customer`), any or all of several, with a timeout and a
-- look-back window; an agent version may declare `cancel_on` events.
--
-- Matching is an index lookup, not a scan of the waiting runs. The executor evaluates the
-- run side of the expression when the wait starts, so each wait stores a concrete key: the
-- event paths it compares and the values they must have, as a JSON array of
-- [path, value] pairs sorted by path (`[["customer", "c1"]]`). The set of paths is the
-- wait's shape; event_shapes lists the shapes in use per (workspace, event name), a handful.
-- A publish projects the body onto each shape and reads exactly the waits whose
-- (workspace_id, event_name, match_key) equals one projection (event_waits_by_key).
--
-- Exactly once, whatever comes first:
--   * A wait row exists only while its run is parked on it: the park commit's transaction
--     inserts it (control_plane/runs/events.py, an effect of the commit pipeline) and the
--     trigger below deletes a run's rows when the run leaves its 'event' wait (woken and
--     claimed, cancelled, failed).
--   * A publish holds an exclusive transaction advisory lock on (workspace, name); a park on
--     that name holds it shared while it inserts its waits and looks back over the stored
--     events. So either the park sees the committed event (look-back), or the publish sees
--     the committed waits: never neither.
--   * Delivery (run_deliver_event) locks the run row, checks the run still waits on
--     'event' and the call has no result, and records the (call, slot) it fills in
--     event_deliveries (primary key: once); the result is written by run_deliver_result
--     (0036), at the run's next seq under its last epoch, like a signal's.
--   * An event is never delivered twice to one run (look-back skips the events this run
--     already received), and a duplicate event id is not stored again and wakes nothing.

CREATE TABLE events (
    workspace_id  text NOT NULL REFERENCES workspaces,
    -- The publisher's id for the event: a second publish with it is the same event.
    event_id      text NOT NULL CHECK (length(event_id) BETWEEN 1 AND 200),
    name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    body          jsonb NOT NULL CHECK (jsonb_typeof(body) = 'object'),
    body_sha256   bytea NOT NULL CHECK (length(body_sha256) = 32),
    published_by  text NOT NULL,
    published_at  timestamptz NOT NULL DEFAULT now(),
    -- How many waits it answered and runs it cancelled when it was published.
    woke          integer NOT NULL DEFAULT 0,
    cancelled     integer NOT NULL DEFAULT 0,
    PRIMARY KEY (workspace_id, event_id)
);

-- Look-back: the recent events of a name.
CREATE INDEX events_by_name ON events (workspace_id, name, published_at);

-- The shapes (sorted lists of event paths) that waits on a name use.
CREATE TABLE event_shapes (
    workspace_id  text NOT NULL,
    event_name    text NOT NULL,
    shape         jsonb NOT NULL CHECK (jsonb_typeof(shape) = 'array'),
    PRIMARY KEY (workspace_id, event_name, shape)
);

-- One row per event a parked wait_for_event call waits for (its slot: the index in the
-- call's list of events).
CREATE TABLE event_waits (
    workspace_id  text NOT NULL,
    run_id        uuid NOT NULL,
    call_seq      integer NOT NULL,
    slot          integer NOT NULL CHECK (slot >= 0),
    event_name    text NOT NULL,
    match_key     jsonb NOT NULL CHECK (jsonb_typeof(match_key) = 'array'),
    PRIMARY KEY (workspace_id, run_id, call_seq, slot),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs ON DELETE CASCADE
);

CREATE INDEX event_waits_by_key ON event_waits (workspace_id, event_name, match_key);

-- The events each wait_for_event call received, one per slot.
CREATE TABLE event_deliveries (
    workspace_id  text NOT NULL,
    run_id        uuid NOT NULL,
    call_seq      integer NOT NULL,
    slot          integer NOT NULL,
    event_id      text NOT NULL,
    delivered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, run_id, call_seq, slot),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs ON DELETE CASCADE
);

-- Fill slot `p_slot` of the wait_for_event call at `p_call` with event `p_event`, if the run
-- is parked on 'event' and the call has no result; when that completes the call (any: one
-- event; all: every slot filled) write its result and wake the run. Returns the result's
-- seq, or NULL (not delivered, or an `all` call still waiting for more).
CREATE FUNCTION run_deliver_event(ws text, rid uuid, p_call integer, p_slot integer, p_event text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    held record;
    started jsonb;
    wanted integer;
    got integer;
    received jsonb;
    ev record;
    answer_seq integer;
BEGIN
    SELECT lease_epoch INTO held FROM runs
    WHERE workspace_id = ws AND run_id = rid AND status = 'waiting' AND wait_reason = 'event'
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM steps WHERE workspace_id = ws AND run_id = rid
               AND kind = 'tool_result' AND ref_seq = p_call) THEN
        RETURN NULL;
    END IF;
    SELECT payload INTO started FROM steps
    WHERE workspace_id = ws AND run_id = rid AND seq = p_call AND kind = 'tool_started';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO event_deliveries (workspace_id, run_id, call_seq, slot, event_id)
    VALUES (ws, rid, p_call, p_slot, p_event)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF started -> 'arguments' ->> 'mode' = 'all' THEN
        wanted := coalesce(jsonb_array_length(started -> 'arguments' -> 'events'), 1);
        SELECT count(*) INTO got FROM event_deliveries
        WHERE workspace_id = ws AND run_id = rid AND call_seq = p_call;
        IF got < wanted THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT name, body INTO ev FROM events WHERE workspace_id = ws AND event_id = p_event;
    SELECT jsonb_agg(jsonb_build_object('slot', d.slot, 'name', e.name, 'event_id', e.event_id,
                                        'body', e.body, 'published_at', e.published_at)
                     ORDER BY d.slot)
    INTO received
    FROM event_deliveries d JOIN events e
      ON e.workspace_id = d.workspace_id AND e.event_id = d.event_id
    WHERE d.workspace_id = ws AND d.run_id = rid AND d.call_seq = p_call;
    answer_seq := run_deliver_result(ws, rid, held.lease_epoch, p_call,
        jsonb_build_object(
            'call_id', started ->> 'call_id', 'tool', 'wait_for_event', 'status', 'ok',
            'output', jsonb_build_object('timed_out', false, 'name', ev.name,
                                         'event_id', p_event, 'body', ev.body,
                                         'events', received)));
    DELETE FROM event_waits WHERE workspace_id = ws AND run_id = rid;
    RETURN answer_seq;
END $$;

-- A run that leaves its 'event' wait (woken and claimed, cancelled, failed) waits for
-- nothing any more: its wait rows go, so the index holds only parked waits.
CREATE FUNCTION runs_drop_event_waits() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM event_waits WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_drop_event_waits AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status = 'waiting' AND OLD.wait_reason = 'event' AND NEW.status <> 'waiting')
    EXECUTE FUNCTION runs_drop_event_waits();

-- A run's input as JSON, or NULL when it is not JSON (cancel-on compares its fields).
CREATE FUNCTION agentrun_input_json(input text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN input::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;
