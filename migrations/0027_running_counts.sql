-- The running counts leave the workspace row (issue 16).
--
-- 0003 kept workspaces.running and agents.running on the rows every claim
-- locks (FOR NO KEY UPDATE, lease.sql step 1) until it commits. A run that
-- finished, parked or was cancelled moved those counts from its own
-- transaction, so it waited behind whichever claim held its workspace (0.88 ms
-- on average in issue 16's profile), and while it held the row every claim
-- skipped the workspace as if another claimer had it. Two statements moving
-- runs of several workspaces in different orders could deadlock on them.
--
-- Now each count is the sum of a few small rows, split by who may write them:
--   * shard 0 takes the increments. A run enters 'running' only by a claim or
--     the fast path, both under the workspace's row lock, so only the lock
--     holder ever writes it: increments never wait for anyone, and the caps
--     argument at the top of lease.sql is unchanged (a count only grows under
--     that lock; the next claim's new statement sees it).
--   * shards 1..8 take the decrements, by the writer's backend (pid mod 8):
--     finishes never touch the workspace row or shard 0, so they wait neither
--     for claims nor, mostly, for each other. A decrement not yet committed
--     only makes a claim more careful, as before.
-- A shard may go negative; the sum is exact. bigint: the sums stay small,
-- the parts only grow, and they would take centuries to overflow.
-- workspace_running(ws) and agent_running(ws, agent) read the sums; the claim
-- reads them inline (an index range of at most 9 rows).

CREATE TABLE workspace_running_counts (
    workspace_id text NOT NULL,
    shard        smallint NOT NULL CHECK (shard BETWEEN 0 AND 8),
    n            bigint NOT NULL,
    PRIMARY KEY (workspace_id, shard)
) WITH (fillfactor = 50);  -- every change is an update of n: keep them HOT

CREATE TABLE agent_running_counts (
    workspace_id text NOT NULL,
    agent_id     text NOT NULL,
    shard        smallint NOT NULL CHECK (shard BETWEEN 0 AND 8),
    n            bigint NOT NULL,
    PRIMARY KEY (workspace_id, agent_id, shard)
) WITH (fillfactor = 50);

INSERT INTO workspace_running_counts (workspace_id, shard, n)
SELECT workspace_id, 0, running FROM workspaces WHERE running <> 0;
INSERT INTO agent_running_counts (workspace_id, agent_id, shard, n)
SELECT workspace_id, agent_id, 0, running FROM agents WHERE running <> 0;

ALTER TABLE workspaces DROP COLUMN running;
ALTER TABLE agents DROP COLUMN running;

CREATE FUNCTION workspace_running(ws text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(n), 0)::bigint FROM workspace_running_counts WHERE workspace_id = ws
$$;

CREATE FUNCTION agent_running(ws text, agent text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(n), 0)::bigint FROM agent_running_counts
    WHERE workspace_id = ws AND agent_id = agent
$$;

-- Move a workspace's and an agent's count by `delta` runs: increments to
-- shard 0 (the workspace lock holder's), decrements to this backend's shard.
CREATE FUNCTION running_counts_add(ws text, agent text, delta bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    s smallint := CASE WHEN delta > 0 THEN 0 ELSE 1 + pg_backend_pid() % 8 END;
BEGIN
    UPDATE workspace_running_counts SET n = n + delta WHERE workspace_id = ws AND shard = s;
    IF NOT FOUND THEN
        INSERT INTO workspace_running_counts AS c VALUES (ws, s, delta)
        ON CONFLICT (workspace_id, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    UPDATE agent_running_counts SET n = n + delta
    WHERE workspace_id = ws AND agent_id = agent AND shard = s;
    IF NOT FOUND THEN
        INSERT INTO agent_running_counts AS c VALUES (ws, agent, s, delta)
        ON CONFLICT (workspace_id, agent_id, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
END $$;

-- As 0003's, with the counts moved off the workspace and agent rows. A run
-- leaving 'running' for a wait with a wake time lowers next_wake_at the way
-- wake-ups do (KEY SHARE, then an update only when it lowers it): a finish no
-- longer writes the workspace row at all.
CREATE OR REPLACE FUNCTION runs_fair_on_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    delta integer := (NEW.status = 'running')::int - (OLD.status = 'running')::int;
    pending_wake timestamptz := CASE WHEN NEW.status IN ('queued', 'waiting') THEN NEW.wake_at END;
BEGIN
    IF delta <> 0 THEN
        PERFORM running_counts_add(NEW.workspace_id, NEW.agent_id, delta);
    END IF;
    IF pending_wake IS NOT NULL THEN
        PERFORM workspace_lower_next_wake(NEW.workspace_id, pending_wake);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION runs_fair_on_insert() RETURNS trigger
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
    PERFORM running_counts_add(n.workspace_id, n.agent_id, n.held)
    FROM (SELECT workspace_id, agent_id, count(*) AS held FROM inserted WHERE status = 'running'
          GROUP BY workspace_id, agent_id ORDER BY workspace_id, agent_id) n;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION runs_fair_on_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM running_counts_add(OLD.workspace_id, OLD.agent_id, -1);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION runs_fair_on_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workspace_running_counts;
    DELETE FROM agent_running_counts;
    UPDATE workspaces SET next_wake_at = NULL WHERE next_wake_at IS NOT NULL;
    RETURN NULL;
END $$;
