-- Signals (issue 11, item 7): RunService.SignalRun delivers a named event to a run (Temporal's
-- signals, DBOS's send), idempotent by its event id; the run's `wait_for_signal` call parks it
-- as wait_reason 'signal' (no wake_at, or the call's timeout) and the signal is that call's
-- result, exactly once.
--
-- A run's signals are a mailbox: each is stored here when it arrives, whatever the run is
-- doing, and answers at most one wait_for_signal call of the same name, oldest first
-- (consumed_seq names the call). Why exactly once, whatever arrives first:
--   * Both writers hold the run row's lock when they deliver: SignalRun locks it
--     (FOR NO KEY UPDATE) before it inserts the signal and delivers; the park commit's
--     run_commit locks it, and the delivery runs in that same transaction
--     (control_plane/signals.py). Deliveries of one run are therefore serial.
--   * A signal that arrives while the run is held (before it parks, or while its park commit
--     is in flight) finds no waiting run and is only stored; the park commit, which waited for
--     the row lock, then reads it (a new statement, a new snapshot) and delivers it.
--   * A signal that arrives after the park finds the run waiting and delivers it itself.
--   * Delivery writes the call's tool_result at the run's next seq under its last epoch and
--     sets wake_at = now() only while the run waits on 'signal' and the call has no result:
--     a parked run has no holder, so nobody else writes its log meanwhile, and a second
--     delivery finds the result (or the signal consumed) and does nothing.
--   * A timeout that woke the run first: the executor that claims it records the timeout as
--     the result; a signal arriving meanwhile finds the run running, stays in the mailbox and
--     answers the next wait of its name. Nothing is lost and nothing answers twice.
CREATE TABLE run_signals (
    workspace_id   text NOT NULL,
    run_id         uuid NOT NULL,
    -- The sender's id for the event: a second SignalRun with it is the same event.
    event_id       text NOT NULL CHECK (length(event_id) BETWEEN 1 AND 200),
    name           text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    payload        jsonb NOT NULL,
    payload_sha256 bytea NOT NULL CHECK (length(payload_sha256) = 32),
    sent_by        text NOT NULL,
    arrival        bigserial,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- The wait_for_signal call it answered (its tool_started seq), and its result's seq.
    consumed_seq   integer,
    result_seq     integer,
    consumed_at    timestamptz,
    PRIMARY KEY (workspace_id, run_id, event_id),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs ON DELETE CASCADE,
    CONSTRAINT signal_consumed_whole CHECK (
        (consumed_seq IS NULL) = (result_seq IS NULL) AND (consumed_seq IS NULL) = (consumed_at IS NULL))
);

-- The oldest unconsumed signal of a name, per run.
CREATE INDEX run_signals_pending ON run_signals (workspace_id, run_id, name, arrival)
    WHERE consumed_seq IS NULL;
-- One signal per call.
CREATE UNIQUE INDEX run_signals_one_per_call ON run_signals (workspace_id, run_id, consumed_seq)
    WHERE consumed_seq IS NOT NULL;

-- Deliver the oldest pending signal to the run's open wait_for_signal call, if the run waits
-- on a signal and a signal of that call's name is pending: the call's tool_result at the
-- run's next seq, the signal consumed, wake_at = now(). Returns the result's seq, or NULL.
-- The caller holds the run row's lock (it is taken here too, for callers that do not).
CREATE FUNCTION run_deliver_signal(ws text, rid uuid) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    held record;
    call record;
    sig record;
    next_seq integer;
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
    SELECT coalesce(max(seq), -1) + 1 INTO next_seq FROM steps
    WHERE workspace_id = ws AND run_id = rid;
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload)
    VALUES (ws, rid, next_seq, 'tool_result', held.lease_epoch, call.seq,
            jsonb_build_object(
                'call_id', call.payload ->> 'call_id', 'tool', 'wait_for_signal', 'status', 'ok',
                'output', jsonb_build_object('name', sig.name, 'event_id', sig.event_id,
                                             'payload', sig.payload, 'timed_out', false,
                                             'sent_at', sig.created_at)));
    UPDATE run_signals SET consumed_seq = call.seq, result_seq = next_seq, consumed_at = now()
    WHERE workspace_id = ws AND run_id = rid AND event_id = sig.event_id;
    UPDATE runs SET wake_at = now(), step_count = step_count + 1, updated_at = now()
    WHERE workspace_id = ws AND run_id = rid;
    RETURN next_seq;
END $$;
