-- Keyed concurrency and throttling (issue 45, item 3): an agent version's spec may declare
-- `concurrency_key: {key: "input.customer_id", limit: 2, rate: {per_seconds, runs}}`, and
-- then at most `limit` of the agent's runs with the same key (the value at that path in
-- the run's input) hold a slot at once, a workspace serving its own customers capping each
-- of them, the others waiting until a slot is passed on. Built around the claim (0047's
-- agentrun_claim_shard is not touched): a run waiting for a slot is 'waiting' (a queued
-- run has no wait_reason: run_waiting_has_reason) with wait_reason 'concurrency_key' and
-- no wake time, which the claim never takes; a slot passed on makes it queued with a wake
-- time, which the update trigger of 0047 publishes as the workspace's next wake.
--
-- Admission, by every path that inserts a run (StartRun, triggers and schedules, session
-- turns, children, re-runs: all through run_admit): runs_key_compute (BEFORE INSERT) reads
-- the version's rule and sets the run's concurrency_key, with no side effect (an insert
-- that ON CONFLICT skips must not take a slot); runs_key_admit (AFTER INSERT, only for a
-- keyed run) takes a slot atomically (an upsert of the key's row while held < limit) or,
-- with none free, parks the run: status 'waiting', wait_reason 'concurrency_key',
-- wake_at NULL, key_slot false. With a rate the grant is no earlier than the key's next_at, which moves on by
-- per_seconds/runs at each grant: a run granted early holds its slot with wake_at then.
--
-- Release, by every path that ends a run (its commit, CancelRun, bulk cancel, a parent's
-- close, max age, a failed heartbeat, whichever statement makes it): runs_key_release on
-- the status change to terminal of a run holding a slot passes the slot to the key's
-- next waiter (highest priority, then oldest), made due at once (or at next_at), or frees
-- it, in the same transaction as the end. The key row is locked first, so an admission
-- parking a run at the same time (which holds that row's lock from its upsert) is seen.
-- A run holds its slot from the grant until it ends, whatever it waits on meanwhile
-- (approval, a sleep, a child, a pause). A key's row goes once it holds nothing and owes
-- no rate wait. Every statement names one workspace (Citus distributes by it).

ALTER TABLE runs ADD COLUMN concurrency_key text,
    ADD COLUMN key_slot boolean NOT NULL DEFAULT false;

CREATE TABLE concurrency_keys (
    workspace_id  text NOT NULL,
    agent_id      text NOT NULL,
    key           text NOT NULL,
    slot_limit    integer NOT NULL CHECK (slot_limit > 0),
    held          integer NOT NULL DEFAULT 0 CHECK (held >= 0),
    -- A rate's spacing between grants (per_seconds / runs), and the earliest next grant.
    spacing       interval,
    next_at       timestamptz,
    PRIMARY KEY (workspace_id, agent_id, key),
    FOREIGN KEY (workspace_id, agent_id) REFERENCES agents ON DELETE CASCADE
);

CREATE INDEX runs_key_waiters ON runs (workspace_id, agent_id, concurrency_key, priority DESC,
                                       created_at, run_id)
    WHERE status = 'waiting' AND wait_reason = 'concurrency_key';

-- The key of a run's input under a rule's path: the value there (a string as it is, any
-- other value as its JSON text, the first 200 characters), or '' when the input is no JSON
-- object or has nothing (or null) there.
CREATE FUNCTION run_key_value(input text, path text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    doc jsonb;
    v jsonb;
BEGIN
    IF input IS NULL OR left(ltrim(input), 1) <> '{' THEN
        RETURN '';
    END IF;
    BEGIN
        doc := input::jsonb;
    EXCEPTION WHEN others THEN
        RETURN '';
    END;
    v := doc #> path;
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN '';
    END IF;
    RETURN left(CASE WHEN jsonb_typeof(v) = 'string' THEN v #>> '{}' ELSE v::text END, 200);
END $$;

CREATE FUNCTION runs_key_compute() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rule jsonb;
BEGIN
    IF NEW.status <> 'queued' THEN
        RETURN NEW;
    END IF;
    SELECT v.spec -> 'concurrency_key' INTO rule FROM agent_versions v
    WHERE v.workspace_id = NEW.workspace_id AND v.agent_id = NEW.agent_id
      AND v.version = NEW.agent_version;
    IF rule IS NULL OR jsonb_typeof(rule) <> 'object' THEN
        RETURN NEW;
    END IF;
    NEW.concurrency_key := run_key_value(
        NEW.input, ARRAY(SELECT jsonb_array_elements_text(rule -> 'path')));
    NEW.key_slot := true;  -- asked for; runs_key_admit parks it when none is free
    RETURN NEW;
END $$;

CREATE TRIGGER runs_key_compute BEFORE INSERT ON runs FOR EACH ROW
    EXECUTE FUNCTION runs_key_compute();

CREATE FUNCTION runs_key_admit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rule jsonb;
    lim integer;
    gap interval;
    t0 timestamptz := coalesce(NEW.wake_at, now());
    got record;
BEGIN
    SELECT v.spec -> 'concurrency_key' INTO rule FROM agent_versions v
    WHERE v.workspace_id = NEW.workspace_id AND v.agent_id = NEW.agent_id
      AND v.version = NEW.agent_version;
    lim := (rule ->> 'limit')::integer;
    IF rule -> 'rate' IS NOT NULL THEN
        gap := make_interval(secs => (rule -> 'rate' ->> 'per_seconds')::float8
                                     / (rule -> 'rate' ->> 'runs')::float8);
    END IF;
    INSERT INTO concurrency_keys AS k (workspace_id, agent_id, key, slot_limit, held, spacing,
                                       next_at)
    VALUES (NEW.workspace_id, NEW.agent_id, NEW.concurrency_key, lim, 1, gap, t0 + gap)
    ON CONFLICT (workspace_id, agent_id, key) DO UPDATE
        SET held = k.held + 1, slot_limit = excluded.slot_limit, spacing = excluded.spacing,
            next_at = greatest(t0, k.next_at) + excluded.spacing
        WHERE k.held < excluded.slot_limit
    RETURNING k.next_at - k.spacing AS grant_at INTO got;
    IF NOT FOUND THEN
        UPDATE runs SET status = 'waiting', wait_reason = 'concurrency_key', wake_at = NULL,
                        key_slot = false
        WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id;
    ELSIF got.grant_at > NEW.wake_at THEN
        UPDATE runs SET wake_at = got.grant_at
        WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_key_admit AFTER INSERT ON runs FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND NEW.key_slot)
    EXECUTE FUNCTION runs_key_admit();

-- The slot of a run that ended: to the key's next waiter, or freed.
CREATE FUNCTION run_key_release(ws text, agent text, k text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    slot record;
    nxt uuid;
    due timestamptz;
BEGIN
    SELECT * INTO slot FROM concurrency_keys
    WHERE workspace_id = ws AND agent_id = agent AND key = k
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF slot.held <= slot.slot_limit THEN
        -- A waiter another transaction holds locked (being cancelled, say) is passed
        -- over; only when every waiter is, the oldest is waited for.
        SELECT run_id INTO nxt FROM runs
        WHERE workspace_id = ws AND agent_id = agent AND concurrency_key = k
          AND status = 'waiting' AND wait_reason = 'concurrency_key'
        ORDER BY priority DESC, created_at, run_id LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED;
        IF nxt IS NULL THEN
            SELECT run_id INTO nxt FROM runs
            WHERE workspace_id = ws AND agent_id = agent AND concurrency_key = k
              AND status = 'waiting' AND wait_reason = 'concurrency_key'
            ORDER BY priority DESC, created_at, run_id LIMIT 1
            FOR NO KEY UPDATE;
        END IF;
    END IF;
    IF nxt IS NOT NULL THEN
        due := greatest(now(), slot.next_at);
        IF slot.spacing IS NOT NULL THEN
            UPDATE concurrency_keys SET next_at = due + slot.spacing
            WHERE workspace_id = ws AND agent_id = agent AND key = k;
        END IF;
        UPDATE runs SET status = 'queued', wait_reason = NULL, wake_at = due, key_slot = true,
                        updated_at = now()
        WHERE workspace_id = ws AND run_id = nxt;
    ELSIF slot.held <= 1 AND (slot.next_at IS NULL OR slot.next_at <= now()) THEN
        DELETE FROM concurrency_keys WHERE workspace_id = ws AND agent_id = agent AND key = k;
    ELSE
        UPDATE concurrency_keys SET held = held - 1
        WHERE workspace_id = ws AND agent_id = agent AND key = k;
    END IF;
END $$;

CREATE FUNCTION runs_key_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM run_key_release(NEW.workspace_id, NEW.agent_id, NEW.concurrency_key);
    RETURN NULL;
END $$;

CREATE TRIGGER runs_key_release AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.key_slot AND NEW.concurrency_key IS NOT NULL
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_key_on_finish();
