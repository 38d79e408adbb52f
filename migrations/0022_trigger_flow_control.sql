-- Flow control on triggers: debounce and batching (control_plane/triggers/flow.py).
--
-- An event of a trigger with a debounce or a batch is still recorded once per
-- dedupe key, but `pending`: no run yet, its flow key (the debounce key's value,
-- or '' for the trigger's one batch) and its place in arrival order (flow_seq).
-- The group row says when the pending events of one key are due: a debounce
-- after its quiet period (every event pushes it back), a batch when it is full
-- or its oldest event has waited max_seconds. The scheduler loop flushes a due
-- group in one transaction that admits the run and marks the events it holds
-- accepted with that run, so a crash at any point neither loses nor repeats one.

ALTER TABLE trigger_events
    ADD COLUMN flow_key text,
    ADD COLUMN flow_seq bigint;

ALTER TABLE trigger_events DROP CONSTRAINT event_status_known;
ALTER TABLE trigger_events ADD CONSTRAINT event_status_known
    CHECK (status IN ('accepted', 'filtered', 'pending'));
ALTER TABLE trigger_events ADD CONSTRAINT event_pending_has_flow_key
    CHECK (status <> 'pending' OR (flow_key IS NOT NULL AND flow_seq IS NOT NULL));

CREATE SEQUENCE trigger_flow_seq;

-- A flush takes a group's pending events in arrival order.
CREATE INDEX trigger_events_pending
    ON trigger_events (workspace_id, trigger_id, flow_key, flow_seq) WHERE status = 'pending';

CREATE TABLE trigger_flow_groups (
    workspace_id  text NOT NULL,
    trigger_id    text NOT NULL,
    flow_key      text NOT NULL,
    mode          text NOT NULL CHECK (mode IN ('debounce', 'batch')),
    -- Pending events counted by arrivals (a flush sets it to those it left).
    pending       integer NOT NULL CHECK (pending >= 0),
    opened_at     timestamptz NOT NULL,
    due_at        timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, trigger_id, flow_key),
    FOREIGN KEY (workspace_id, trigger_id) REFERENCES triggers
);

-- The scheduler's flush pass: groups by due time.
CREATE INDEX trigger_flow_groups_due ON trigger_flow_groups (due_at);
