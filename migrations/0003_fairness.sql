-- Fair multi-tenant claiming and concurrency caps (issue 6).
--
-- A global first-in-first-out claim lets one workspace that imports 50k runs
-- make every other workspace wait behind them. The claim now picks the
-- workspace served least recently among those with due runs and room under
-- their cap, then that workspace's oldest due run, with a cap per agent
-- inside it (control_plane/store/sql/lease.sql says how, and why it is safe
-- with several claimers at once).
--
-- So that the claim reads a few small rows instead of counting runs:
--   * workspaces.running / agents.running count the runs held by executors,
--     kept exact by the triggers below on every way a run enters or leaves
--     'running' (claim, commit, cancel, deadline, hand-back, delete);
--   * workspaces.next_wake_at is a lower bound on the earliest wake_at of the
--     workspace's queued or waiting runs (NULL: none with a wake time). It
--     only ever goes down here; the claim raises it, under a lock that keeps
--     every writer that could lower it out (lease.sql, "raising next_wake_at").
-- A workspace with nothing due costs nothing; a million parked runs cost an
-- index, as before.

CREATE TABLE plans (
    plan             text PRIMARY KEY CHECK (plan ~ '^[a-z][a-z0-9_-]{0,31}$'),
    -- Runs executing at once; NULL: set per workspace (enterprise).
    max_concurrency  integer CHECK (max_concurrency > 0)
);

INSERT INTO plans (plan, max_concurrency) VALUES ('free', 2), ('team', 20), ('enterprise', NULL);

ALTER TABLE workspaces
    ADD CONSTRAINT workspace_plan_known FOREIGN KEY (plan) REFERENCES plans,
    ADD COLUMN running integer NOT NULL DEFAULT 0,
    ADD COLUMN next_wake_at timestamptz,
    ADD CONSTRAINT workspace_running_not_negative CHECK (running >= 0);

ALTER TABLE agents
    -- NULL: no cap of its own (the workspace's still applies).
    ADD COLUMN max_concurrency integer CHECK (max_concurrency > 0),
    ADD COLUMN running integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT agent_running_not_negative CHECK (running >= 0);

-- Copied from the agent version at admission, like the other limits: how many
-- times in a row the model provider may fail before the run fails.
ALTER TABLE runs ADD COLUMN model_retry_budget integer NOT NULL DEFAULT 30
    CHECK (model_retry_budget >= 0);

-- The claim no longer reads one global queue ordered by wake_at: it reads
-- each chosen workspace's agents' queues. runs_due keeps its job (every run
-- waiting for its turn, parked ones costing nothing at claim time) with the
-- keys the fair claim walks; run_id orders runs admitted in one transaction.
DROP INDEX runs_due;
CREATE INDEX runs_due ON runs (workspace_id, agent_id, wake_at, run_id)
    WHERE status IN ('queued', 'waiting');

-- Held runs by lease expiry: a lapsed lease is due whatever its workspace's
-- cap (it already holds its slot). Small: only running runs are in it.
CREATE INDEX runs_leases ON runs (wake_at) WHERE status = 'running';

-- Workspaces that may have something due, by when.
CREATE INDEX workspaces_due ON workspaces (next_wake_at) WHERE next_wake_at IS NOT NULL;

UPDATE workspaces w SET
    running = (SELECT count(*) FROM runs r
               WHERE r.workspace_id = w.workspace_id AND r.status = 'running'),
    next_wake_at = (SELECT min(r.wake_at) FROM runs r
                    WHERE r.workspace_id = w.workspace_id AND r.status IN ('queued', 'waiting'));

UPDATE agents a SET running = (
    SELECT count(*) FROM runs r
    WHERE r.workspace_id = a.workspace_id AND r.agent_id = a.agent_id AND r.status = 'running');

-- Lower a workspace's next_wake_at to `wake`. The KEY SHARE lock, held until
-- this transaction ends, is what keeps a claim from raising next_wake_at past
-- a run it cannot see yet (the claim raises only under FOR UPDATE, which
-- conflicts with it); the UPDATE runs on a snapshot taken after the lock.
CREATE FUNCTION workspace_lower_next_wake(ws text, wake timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM workspaces WHERE workspace_id = ws FOR KEY SHARE;
    UPDATE workspaces SET next_wake_at = wake
    WHERE workspace_id = ws AND (next_wake_at IS NULL OR next_wake_at > wake);
END $$;

-- One run changed status or wake time: move the running counts and the
-- workspace's next_wake_at. The workspace row is locked before the agent's,
-- the order the claim takes them in.
CREATE FUNCTION runs_fair_on_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    delta integer := (NEW.status = 'running')::int - (OLD.status = 'running')::int;
    pending_wake timestamptz := CASE WHEN NEW.status IN ('queued', 'waiting') THEN NEW.wake_at END;
BEGIN
    IF delta <> 0 THEN
        UPDATE workspaces SET running = running + delta,
                              next_wake_at = least(next_wake_at, pending_wake)
        WHERE workspace_id = NEW.workspace_id;
        UPDATE agents SET running = running + delta
        WHERE workspace_id = NEW.workspace_id AND agent_id = NEW.agent_id;
    ELSIF pending_wake IS NOT NULL THEN
        PERFORM workspace_lower_next_wake(NEW.workspace_id, pending_wake);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_fair_update AFTER UPDATE ON runs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR (NEW.status IN ('queued', 'waiting') AND NEW.wake_at IS DISTINCT FROM OLD.wake_at))
    EXECUTE FUNCTION runs_fair_on_update();

-- Admissions, once per statement (a bulk import touches each workspace once).
CREATE FUNCTION runs_fair_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    due record;
BEGIN
    FOR due IN
        SELECT workspace_id, min(wake_at) AS wake FROM inserted
        WHERE status IN ('queued', 'waiting') AND wake_at IS NOT NULL
        GROUP BY workspace_id ORDER BY workspace_id
    LOOP
        PERFORM workspace_lower_next_wake(due.workspace_id, due.wake);
    END LOOP;
    -- Admission never inserts running runs; a bulk load might.
    UPDATE workspaces w SET running = w.running + n.held
    FROM (SELECT workspace_id, count(*) AS held FROM inserted WHERE status = 'running'
          GROUP BY workspace_id) n
    WHERE w.workspace_id = n.workspace_id;
    UPDATE agents a SET running = a.running + n.held
    FROM (SELECT workspace_id, agent_id, count(*) AS held FROM inserted WHERE status = 'running'
          GROUP BY workspace_id, agent_id) n
    WHERE a.workspace_id = n.workspace_id AND a.agent_id = n.agent_id;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_fair_insert AFTER INSERT ON runs REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION runs_fair_on_insert();

CREATE FUNCTION runs_fair_on_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE workspaces SET running = running - 1 WHERE workspace_id = OLD.workspace_id;
    UPDATE agents SET running = running - 1
    WHERE workspace_id = OLD.workspace_id AND agent_id = OLD.agent_id;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_fair_delete AFTER DELETE ON runs FOR EACH ROW
    WHEN (OLD.status = 'running') EXECUTE FUNCTION runs_fair_on_delete();

-- TRUNCATE fires no row triggers: with no runs left, nothing runs or is due.
CREATE FUNCTION runs_fair_on_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE workspaces SET running = 0, next_wake_at = NULL
    WHERE running <> 0 OR next_wake_at IS NOT NULL;
    UPDATE agents SET running = 0 WHERE running <> 0;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_fair_truncate AFTER TRUNCATE ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION runs_fair_on_truncate();
