-- Keys declared on a trigger (issue 45, item 3: "an agent version (or a trigger) declares a
-- key"): a trigger's concurrency_key rule (kept in its config, as its priority is) rides on
-- each run it starts as runs.key_rule, and 0050's admission triggers read that rule instead
-- of the version's when it is set: the trigger's rule overrides the version's, for its runs
-- only. NULL (every other run): the version's rule, as before. A trigger's path is read
-- from the event it received (a webhook's JSON body), which the run's input only quotes in
-- a text: the control plane hands the event over with the rule, and runs_key_compute reads the
-- key there (run_key_value, as from an input) and keeps it as the rule's `value`. Only
-- the two admission functions change; the release reads the key's row, which keeps the
-- limit and spacing the latest admission declared. A run's key is still (agent, value): a
-- trigger's runs and the agent's other runs with the same value share that key's slots.

ALTER TABLE runs ADD COLUMN key_rule jsonb;

CREATE OR REPLACE FUNCTION runs_key_compute() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rule jsonb := NEW.key_rule;
BEGIN
    IF rule ? 'document' THEN
        -- A trigger's rule brings the event it read (a webhook's JSON body, a mail's
        -- fields), which the run's input only quotes: the key is read there, by the same
        -- rules, and the rule keeps the key as `value`, not the event.
        NEW.key_rule := (rule - 'document') || jsonb_build_object('value', run_key_value(
            rule ->> 'document', ARRAY(SELECT jsonb_array_elements_text(rule -> 'path'))));
        rule := NEW.key_rule;
    END IF;
    IF NEW.status <> 'queued' THEN
        RETURN NEW;
    END IF;
    IF rule IS NULL THEN
        SELECT v.spec -> 'concurrency_key' INTO rule FROM agent_versions v
        WHERE v.workspace_id = NEW.workspace_id AND v.agent_id = NEW.agent_id
          AND v.version = NEW.agent_version;
    END IF;
    IF rule IS NULL OR jsonb_typeof(rule) <> 'object' THEN
        RETURN NEW;
    END IF;
    -- A trigger's rule carries the key read from its event (above).
    NEW.concurrency_key := coalesce(rule ->> 'value', run_key_value(
        NEW.input, ARRAY(SELECT jsonb_array_elements_text(rule -> 'path'))));
    NEW.key_slot := true;  -- asked for; runs_key_admit parks it when none is free
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION runs_key_admit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    rule jsonb := NEW.key_rule;
    lim integer;
    gap interval;
    t0 timestamptz := coalesce(NEW.wake_at, now());
    got record;
    grant_at timestamptz;
BEGIN
    IF rule IS NULL THEN
        SELECT v.spec -> 'concurrency_key' INTO rule FROM agent_versions v
        WHERE v.workspace_id = NEW.workspace_id AND v.agent_id = NEW.agent_id
          AND v.version = NEW.agent_version;
    END IF;
    lim := (rule ->> 'limit')::integer;
    IF rule -> 'rate' IS NOT NULL THEN
        gap := make_interval(secs => (rule -> 'rate' ->> 'per_seconds')::float8
                                     / (rule -> 'rate' ->> 'runs')::float8);
    END IF;
    -- The slot, taken atomically while one is free (the upsert locks the key's row); the
    -- rate's arithmetic is done here, on constants: Citus refuses a stable function (a
    -- timestamptz plus an interval) over a column in a distributed statement's SET or
    -- RETURNING, which is where 0050 had it.
    INSERT INTO concurrency_keys AS k (workspace_id, agent_id, key, slot_limit, held, spacing,
                                       next_at)
    VALUES (NEW.workspace_id, NEW.agent_id, NEW.concurrency_key, lim, 1, gap,
            CASE WHEN gap IS NOT NULL THEN t0 END)
    ON CONFLICT (workspace_id, agent_id, key) DO UPDATE
        SET held = k.held + 1, slot_limit = excluded.slot_limit, spacing = excluded.spacing
        WHERE k.held < excluded.slot_limit
    RETURNING k.next_at INTO got;
    IF NOT FOUND THEN
        UPDATE runs SET status = 'waiting', wait_reason = 'concurrency_key', wake_at = NULL,
                        key_slot = false
        WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id;
        RETURN NULL;
    END IF;
    IF gap IS NULL THEN
        -- No rate (or no longer one): nothing spaces the grants.
        IF got.next_at IS NOT NULL THEN
            UPDATE concurrency_keys SET next_at = NULL
            WHERE workspace_id = NEW.workspace_id AND agent_id = NEW.agent_id
              AND key = NEW.concurrency_key;
        END IF;
        RETURN NULL;
    END IF;
    -- The grant: now, or when the rate next allows one; the one after it a gap later.
    grant_at := greatest(t0, got.next_at);
    UPDATE concurrency_keys SET next_at = grant_at + gap
    WHERE workspace_id = NEW.workspace_id AND agent_id = NEW.agent_id
      AND key = NEW.concurrency_key;
    IF grant_at > NEW.wake_at THEN
        UPDATE runs SET wake_at = grant_at
        WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id;
    END IF;
    RETURN NULL;
END $$;
