-- A run's calls that an argument constraint refused, counted (issue 48, "refusals are
-- visible outcomes").
--
-- With the default on_refusal (retry) a run whose calls were refused can still complete;
-- its status alone then read as a plain success. Every caller (GetRun/ListRuns, the CLI,
-- the console, the HTTP API) must see that it was not, without reading the log: the
-- commit that records a refusal (a tool_result naming `refused_by`) adds it here in the
-- same statement, and the run's outcome (completed, completed with refusals, only
-- refused) is derived from this count and tool_calls. Runs before this migration count 0.
ALTER TABLE runs ADD COLUMN refused_calls integer NOT NULL DEFAULT 0;

-- Allowlists a workspace keeps (issue 48: "recipients in a list the workspace keeps"), by
-- name: {"payees": ["GB33...", ...]}. A value_allowed constraint names one in its
-- workspace_list; the control plane reads it when it assigns a run, so the executor never
-- reads the database. Set with WorkspaceAdminService.SetAllowlist.
ALTER TABLE workspaces ADD COLUMN allowlists jsonb NOT NULL DEFAULT '{}';
