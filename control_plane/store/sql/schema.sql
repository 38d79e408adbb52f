-- agentrun's database as it is now: every table, index, sequence, function and
-- trigger, in one file, by concept, for reading.
--
-- Nothing reads this file at run time. A database is built by the migrations
-- alone (migrations/NNNN_what.sql, applied in order by
-- control_plane/store/migrate.py), and control_plane/store/queries.py skips
-- this file (it holds no named queries). This file builds the same database:
-- tests/integration/test_schema_file.py builds one database each way and
-- compares them through the catalog.
--
-- Changing the schema: a new migration carries only the change, and this file
-- is changed to match in the same commit (migrations/README.md).
--
-- Two things here follow the migrations rather than the reader:
--   * Columns are in the order the migrations leave them (a migration can only
--     append a column), because row types follow it: the claim returns whole
--     runs rows.
--   * Function bodies are exactly as the migrations wrote them, comments
--     included: the database keeps a body verbatim and the test compares it
--     so. The comments between the statements are this file's own.
--
--   1. Plans and workspaces            8. Approvals and the outbox
--   2. Agents and their tools          9. Triggers and schedules
--   3. Runs and steps                 10. Sessions
--   4. Children and signals           11. Connections
--   5. Running counts and next wake   12. Credits
--   6. Executors and releases         13. Identity, access and keys
--   7. The claim
--
-- Every tenant table leads its keys with workspace_id, which is also the
-- distribution column should these tables ever be sharded by workspace.


-- ===========================================================================
-- 1. Plans and workspaces
-- ===========================================================================

-- A plan caps how many runs of a workspace execute at once.
CREATE TABLE plans (
    plan             text PRIMARY KEY CONSTRAINT plans_plan_check CHECK (plan ~ '^[a-z][a-z0-9_-]{0,31}$'),
    -- Runs executing at once; NULL: set per workspace (enterprise).
    max_concurrency  integer CONSTRAINT plans_max_concurrency_check CHECK (max_concurrency > 0)
);

INSERT INTO plans (plan, max_concurrency) VALUES ('free', 2), ('team', 20), ('enterprise', NULL);

-- A tenant. The fair claim takes turns between workspaces in
-- workspace_turns (below).
CREATE TABLE workspaces (
    workspace_id     text PRIMARY KEY
        CONSTRAINT workspaces_workspace_id_check CHECK (workspace_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    plan             text NOT NULL DEFAULT 'team' CONSTRAINT workspace_plan_known REFERENCES plans,
    max_concurrency  integer NOT NULL DEFAULT 20
        CONSTRAINT workspaces_max_concurrency_check CHECK (max_concurrency > 0),
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- Finished runs (completed, failed, cancelled) are kept this many days
    -- after they finished, then the retention loop (control_plane/runs/
    -- retention.py) deletes them with everything that names them, a bounded
    -- batch per statement. 0 keeps everything.
    retention_days   integer NOT NULL DEFAULT 0
        CONSTRAINT workspace_retention_days_range CHECK (retention_days BETWEEN 0 AND 36500),
    -- When an approver is flagged for approving too fast (issue 48; NULL: never):
    -- {"approvals", "window_seconds", "max_decide_seconds"}.
    approval_watch   jsonb,
    -- Named allowlists value_allowed constraints name (workspace_list), read
    -- when a run is assigned (issue 48): {"payees": ["GB33...", ...]}.
    allowlists       jsonb NOT NULL DEFAULT '{}',
    -- How long a run may wait for each kind of thing (approval, human, repeat, connection,
    -- signal, child) before it fails, in seconds (issue 43): only the workspace's own
    -- choices; the platform's default applies to the rest (control_plane/runs/
    -- wait_limits.py); 0 turns a kind off, by choice.
    wait_limits      jsonb NOT NULL DEFAULT '{}',
    -- The claim gives the workspace no turn while set (SetQueuePaused).
    queue_paused     boolean NOT NULL DEFAULT false
);

-- The line the fair claim serves workspaces in (section 7): last_served_at
-- orders it, next_wake_at says when the workspace may next have a run due or
-- a lease ending, so that a workspace with nothing due costs the claim
-- nothing. A row is made by the workspace's first wake. Under Citus it stays
-- on the coordinator, where the claim takes its turns (0047).
CREATE TABLE workspace_turns (
    workspace_id     text PRIMARY KEY,
    -- When the fair claim last served this workspace: the line's order.
    last_served_at   timestamptz NOT NULL DEFAULT '-infinity',
    -- A lower bound on the earliest wake_at of the workspace's queued or
    -- waiting runs and of its leases' ends (NULL: none). Writers only lower
    -- it (workspace_lower_next_wake); the claim raises it, under a lock that
    -- keeps every writer that could lower it out (section 7).
    next_wake_at     timestamptz
);

-- Workspaces that may have something due, by when (the claim's step 1).
CREATE INDEX workspace_turns_due ON workspace_turns (next_wake_at) WHERE next_wake_at IS NOT NULL;

-- Under Citus, the wakes lowered on the shards: a trigger firing on a shard
-- cannot reach workspace_turns on the coordinator, so the distribution step
-- (control_plane/store/citus.py) makes workspace_lower_next_wake write here,
-- beside the runs, and each claim folds the due ones into workspace_turns
-- first. Empty on plain PostgreSQL.
CREATE TABLE workspace_wakes (
    workspace_id     text PRIMARY KEY,
    wake_at          timestamptz NOT NULL
);

CREATE INDEX workspace_wakes_due ON workspace_wakes (wake_at);


-- ===========================================================================
-- 2. Agents and their tools
-- ===========================================================================

CREATE TABLE agents (
    workspace_id     text NOT NULL REFERENCES workspaces,
    agent_id         text NOT NULL
        CONSTRAINT agents_agent_id_check CHECK (agent_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    display_name     text NOT NULL DEFAULT '',
    latest_version   integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- Runs of this agent executing at once; NULL: no cap of its own (the
    -- workspace's still applies).
    max_concurrency  integer CONSTRAINT agents_max_concurrency_check CHECK (max_concurrency > 0),
    PRIMARY KEY (workspace_id, agent_id),
    -- The claim takes none of its runs while set (SetQueuePaused).
    paused           boolean NOT NULL DEFAULT false
);

-- Immutable once written: a run names (agent_id, version) and keeps it.
CREATE TABLE agent_versions (
    workspace_id   text NOT NULL,
    agent_id       text NOT NULL,
    version        integer NOT NULL CONSTRAINT agent_versions_version_check CHECK (version > 0),
    spec           jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- The registry entries the version was published with: name ->
    -- {"workspace_id": '' (shared) or its own, "version": n}; its runs use
    -- exactly those.
    tool_versions  jsonb,
    -- The pinned built-ins (tools that need executor code): only executors
    -- carrying all of them claim its runs. NULL on versions published before
    -- the registry: the claim then checks every one of spec.tools.
    code_tools     jsonb,
    PRIMARY KEY (workspace_id, agent_id, version),
    FOREIGN KEY (workspace_id, agent_id) REFERENCES agents
);

-- Tools as data: a workspace's own tools, versioned, beside the platform's
-- shared built-in entries (workspace_id '', source 'builtin'), in one
-- registry. A row is one immutable version of one tool: `definition` is the
-- agentrun.v1.Tool message as JSON (proto field names) without the fields the
-- key and the columns hold. No credential is ever part of a definition: a tool
-- names a connection, and the token is fetched at call time.
CREATE TABLE tools (
    workspace_id  text NOT NULL,
    name          text NOT NULL CONSTRAINT tool_name_shape CHECK (name ~ '^[A-Za-z0-9_-]{1,64}$'),
    version       integer NOT NULL CONSTRAINT tool_version_positive CHECK (version > 0),
    definition    jsonb NOT NULL,
    source        text NOT NULL,
    created_by    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, name, version)
);

-- Remote MCP servers: a streamable HTTP endpoint and the connection that
-- authenticates to it (a provider name, '' for none; the token is fetched
-- from the connections when the server is asked, never stored here). Its
-- tools/list is snapshotted into the registry (tools, source 'mcp').
CREATE TABLE mcp_servers (
    workspace_id     text NOT NULL REFERENCES workspaces,
    server_id        text NOT NULL
        CONSTRAINT mcp_server_id_shape CHECK (server_id ~ '^[a-z][a-z0-9_-]{0,62}$'),
    url              text NOT NULL
        CONSTRAINT mcp_server_url_shape CHECK (url ~ '^https?://' AND length(url) <= 2048),
    connection       text NOT NULL DEFAULT '',
    created_by       text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_sync_at     timestamptz,
    -- Each call's deadline in seconds (0: AGENTRUN_TOOL_TIMEOUT_SECONDS),
    -- copied into the server's registry entries at every sync.
    timeout_seconds  double precision NOT NULL DEFAULT 0
        CONSTRAINT mcp_server_timeout_range CHECK (timeout_seconds >= 0 AND timeout_seconds <= 300),
    PRIMARY KEY (workspace_id, server_id)
);


-- ===========================================================================
-- 3. Runs and steps
-- ===========================================================================

-- A run: one agent version working through one input. Its state is this row
-- and its append-only step log; an executor holds it under a lease (fenced by
-- lease_epoch, which every guarded write names).
CREATE TABLE runs (
    workspace_id             text NOT NULL REFERENCES workspaces,
    run_id                   uuid NOT NULL,
    agent_id                 text NOT NULL,
    agent_version            integer NOT NULL,
    status                   text NOT NULL DEFAULT 'queued',
    wait_reason              text,
    -- Runnable at this time. While running it is the lease expiry; while
    -- waiting on an event it is NULL until the event sets it to now().
    wake_at                  timestamptz,
    lease_owner              text,
    lease_epoch              bigint NOT NULL DEFAULT 0,
    attempt                  integer NOT NULL DEFAULT 0,
    request_id               text,
    input                    text NOT NULL,
    output                   text,
    error                    text,
    -- Limits, copied from the agent version at admission like every limit
    -- below, so that publishing a version never changes a run under way.
    max_steps                integer NOT NULL,
    max_tokens               bigint NOT NULL,
    max_tool_calls           integer NOT NULL,
    -- Active time allowed: the time executors hold the run (active_seconds),
    -- not the wall clock; a run parked on an approval for hours keeps it.
    deadline_seconds         integer NOT NULL,
    -- Counters. step_count counts what the log holds: every statement that
    -- inserts steps bumps it in the same statement (tests/unit/test_queries.py
    -- checks that each does).
    step_count               integer NOT NULL DEFAULT 0,
    model_calls              integer NOT NULL DEFAULT 0,
    tool_calls               integer NOT NULL DEFAULT 0,
    tokens_used              bigint NOT NULL DEFAULT 0,
    created_at               timestamptz NOT NULL DEFAULT now(),
    updated_at               timestamptz NOT NULL DEFAULT now(),
    started_at               timestamptz,
    finished_at              timestamptz,
    -- How many times in a row the model provider may fail before the run fails.
    model_retry_budget       integer NOT NULL DEFAULT 30
        CONSTRAINT runs_model_retry_budget_check CHECK (model_retry_budget >= 0),
    -- Who started the run (four eyes: the starter may not approve its calls).
    started_by               text,
    -- The time of the run's holds that ended, and when the current hold began
    -- (set by the claim; NULL unless running). While held, the active time so
    -- far is active_seconds + run_held_seconds(held_since, wake_at, now); the
    -- heartbeat refuses to renew a lease once that reaches deadline_seconds.
    active_seconds           double precision NOT NULL DEFAULT 0
        CONSTRAINT run_active_not_negative CHECK (active_seconds >= 0),
    held_since               timestamptz,
    -- Max age bounds the run as a whole, parked or not (0: none): it fails at
    -- expires_at (admission + max age), held or not.
    max_age_seconds          integer NOT NULL DEFAULT 0
        CONSTRAINT run_max_age_not_negative CHECK (max_age_seconds >= 0),
    expires_at               timestamptz,
    -- The Nth call of the same tool with the same arguments is not started:
    -- the run parks (wait_reason 'repeat') until a person decides.
    repeat_limit             integer NOT NULL CONSTRAINT run_repeat_limit_positive CHECK (repeat_limit > 0),
    -- Parked on a connection (wait_reason 'connection'): reconnecting wakes it.
    waiting_connection_id    uuid,
    -- A child run: its parent and the parent's start_child call (section 4).
    parent_run_id            uuid,
    parent_seq               integer,
    -- Usage and cost, summed by each commit; credits this run reserved, in
    -- credit_chunks reservations (0: not metered; section 12).
    input_tokens             bigint NOT NULL DEFAULT 0,
    output_tokens            bigint NOT NULL DEFAULT 0,
    cached_tokens            bigint NOT NULL DEFAULT 0,
    reasoning_tokens         bigint NOT NULL DEFAULT 0,
    cost_micros              bigint NOT NULL DEFAULT 0,
    credits_reserved_micros  bigint NOT NULL DEFAULT 0,
    credit_chunks            integer NOT NULL DEFAULT 0,
    -- Past this many estimated prompt tokens the executor summarises older
    -- steps into a `summary` step (0: never).
    context_tokens           integer NOT NULL DEFAULT 0
        CONSTRAINT run_context_tokens_not_negative CHECK (context_tokens >= 0),
    -- A fork: the run whose log it copied, up to which step. No foreign key:
    -- retention may delete the source while its forks live on.
    forked_from_run_id       uuid,
    forked_from_seq          integer,
    -- The release the run is pinned to while a turn is in progress on it: the
    -- claiming executor's, recorded by the claim; while set, only executors of
    -- that release (or of one that continues it) take the run. A park between
    -- turns clears it (run_commit): a parked run continues on the newest release.
    release                  text,
    -- Higher goes first within the workspace's own share, never past another
    -- workspace's turn; set at admission, never changed.
    priority                 smallint NOT NULL DEFAULT 0
        CONSTRAINT run_priority_range CHECK (priority BETWEEN -100 AND 100),
    -- The step log's shape version it was last written in: the claim records its
    -- claimer's release's (releases.log_version).
    log_version              integer NOT NULL DEFAULT 1,
    -- Calls an argument constraint refused (a tool_result naming refused_by),
    -- counted by the commit that records them: with tool_calls, the outcome of
    -- a run that completed regardless (issue 48).
    refused_calls            integer NOT NULL DEFAULT 0,
    -- Set at admission and by the run's set_metadata calls (the trigger
    -- steps_set_metadata): a few slugs, and a JSON object of at most 4 KiB.
    tags                     text[] NOT NULL DEFAULT '{}',
    metadata                 jsonb NOT NULL DEFAULT '{}'
        CONSTRAINT run_metadata_object CHECK (jsonb_typeof(metadata) = 'object'),
    -- PauseRun: the claim skips it (a running one hands itself back first).
    paused                   boolean NOT NULL DEFAULT false,
    -- A start_children child: its place in the call's list (NULL: start_child's);
    -- what its parent's close does to it while it is open (NULL: admitted before
    -- policies, left alone); a parent with a child to cancel so (section 4).
    parent_index             integer,
    parent_close             text
        CONSTRAINT run_parent_close_known CHECK (parent_close IN ('cancel', 'abandon', 'finish')),
    closes_children          boolean NOT NULL DEFAULT false,
    -- A run of a version declaring a concurrency_key: its key, and whether it holds one
    -- of the key's slots (concurrency keys, at the end of this file).
    concurrency_key          text,
    key_slot                 boolean NOT NULL DEFAULT false,
    -- The session of a turn and of its whole descent (children, forks), set at
    -- admission: who may see a private session's runs (migration 0053).
    session_id               uuid,
    -- The concurrency_key rule of the trigger that started it (0054), read at admission
    -- instead of its version's; NULL: its version's.
    key_rule                 jsonb,
    PRIMARY KEY (workspace_id, run_id),
    FOREIGN KEY (workspace_id, agent_id, agent_version) REFERENCES agent_versions,
    CONSTRAINT run_status_known CHECK (
        status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled')),
    CONSTRAINT run_running_has_lease CHECK (
        status <> 'running' OR (lease_owner IS NOT NULL AND wake_at IS NOT NULL)),
    CONSTRAINT run_waiting_has_reason CHECK ((status = 'waiting') = (wait_reason IS NOT NULL)),
    CONSTRAINT run_terminal_is_final CHECK (
        (status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT run_output_or_error CHECK (output IS NULL OR error IS NULL),
    CONSTRAINT run_held_while_running CHECK ((status = 'running') = (held_since IS NOT NULL)),
    CONSTRAINT run_expires_with_max_age CHECK ((max_age_seconds > 0) = (expires_at IS NOT NULL)),
    CONSTRAINT run_fork_origin_whole CHECK (
        (forked_from_run_id IS NULL) = (forked_from_seq IS NULL)
        AND (forked_from_seq IS NULL OR forked_from_seq >= 0))
);

-- Every run waiting for its turn, by agent and wake time: the earliest wake
-- time of an agent's queue (the claim's raise of next_wake_at), with parked
-- runs costing nothing at claim time.
CREATE INDEX runs_due ON runs (workspace_id, agent_id, wake_at, run_id)
    WHERE status IN ('queued', 'waiting');
-- The claim's order within an agent's queue: highest priority, then oldest due
-- (section 7 reads it by a skip scan or a walk over the priority levels).
CREATE INDEX runs_due_by_priority ON runs (workspace_id, agent_id, priority DESC, wake_at, run_id)
    WHERE status IN ('queued', 'waiting');
-- Held runs by lease expiry: a lapsed lease is due whatever its workspace's cap
-- (it holds its slot already). Small: only running runs are in it.
CREATE INDEX runs_leases ON runs (wake_at) WHERE status = 'running';
-- A workspace's leases by their end: the claim's takeover and raise, per workspace.
CREATE INDEX runs_leases_by_workspace ON runs (workspace_id, wake_at) WHERE status = 'running';
-- Runs that may outlive their max age, by when (the sweep reads it).
CREATE INDEX runs_expiring ON runs (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('queued', 'running', 'waiting');
CREATE INDEX runs_by_created ON runs (workspace_id, created_at DESC, run_id DESC);
-- A retried StartRun with the same request id finds the run it admitted.
CREATE UNIQUE INDEX runs_request_id ON runs (workspace_id, agent_id, request_id)
    WHERE request_id IS NOT NULL;
CREATE INDEX runs_waiting_connection ON runs (workspace_id, waiting_connection_id)
    WHERE waiting_connection_id IS NOT NULL;
-- At most one child per start_child call, and per entry of a start_children
-- call, whatever retries happen.
CREATE UNIQUE INDEX runs_child_of ON runs (workspace_id, parent_run_id, parent_seq,
                                           coalesce(parent_index, -1))
    WHERE parent_run_id IS NOT NULL;
-- A source's forks (ListRuns(forked_from_run_id)).
CREATE INDEX runs_forks_of ON runs (workspace_id, forked_from_run_id, created_at DESC, run_id DESC)
    WHERE forked_from_run_id IS NOT NULL;
-- A release's drain progress: its unfinished runs by status (held ones by
-- when their hold began). The claim's release filter rides on runs_due and
-- runs_leases instead.
CREATE INDEX runs_by_release ON runs (release, status, held_since)
    WHERE release IS NOT NULL AND status IN ('queued', 'running', 'waiting');

-- ListRuns(tag): only tagged runs are in it (most runs carry none).
CREATE INDEX runs_by_tag ON runs USING gin (tags) WHERE tags <> '{}';

-- A session's runs, its turns' whole descent (migration 0053).
CREATE INDEX runs_of_session ON runs (workspace_id, session_id) WHERE session_id IS NOT NULL;

-- The runs that finished on each release (their last turn ran there): `releases
-- list`'s completed and failed counts, which a ramp is judged on.
CREATE INDEX runs_finished_by_release ON runs (release, status)
    WHERE release IS NOT NULL AND status IN ('completed', 'failed');
-- Retention: old finished runs by workspace and finish time.
CREATE INDEX runs_finished ON runs (workspace_id, finished_at) WHERE finished_at IS NOT NULL;

-- The step log. Append-only: a step row is never updated or deleted (the
-- one exception: a queued session turn's input step receives the transcript
-- before the run is first claimed, section 10).
CREATE TABLE steps (
    workspace_id  text NOT NULL,
    run_id        uuid NOT NULL,
    seq           integer NOT NULL CONSTRAINT steps_seq_check CHECK (seq >= 0),
    kind          text NOT NULL CONSTRAINT steps_kind_check CHECK (
        kind IN ('forked', 'input', 'model_decision', 'tool_started', 'tool_result', 'park',
                 'finish', 'approval_requested', 'approval_decided', 'summary')),
    -- The lease epoch the step was written under (0 for the admission's steps).
    epoch         bigint NOT NULL,
    ref_seq       integer,
    payload       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, run_id, seq),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs,
    CONSTRAINT step_ref_is_earlier CHECK (ref_seq IS NULL OR ref_seq < seq),
    -- The release of the executor that wrote the step (its run's pin then);
    -- NULL for the platform's own steps (the input, a decision, a cancel).
    release       text
);

-- The tool_result steps that reference a payload, by its sha256: payloads are
-- content-addressed, so another run (or a fork's copied steps) may reference
-- one; retention hands such a payload over instead of deleting it.
CREATE INDEX steps_payload_refs ON steps (workspace_id, ((payload -> 'payload' ->> 'sha256')))
    WHERE kind = 'tool_result' AND payload ? 'payload';

-- A set_metadata call's ok result sets the run's metadata and tags (its output
-- holds both whole, as the executor computed them from the log).
CREATE FUNCTION runs_metadata_on_step() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs r SET
        metadata = CASE WHEN jsonb_typeof(NEW.payload -> 'output' -> 'metadata') = 'object'
                        THEN NEW.payload -> 'output' -> 'metadata' ELSE r.metadata END,
        tags = CASE WHEN jsonb_typeof(NEW.payload -> 'output' -> 'tags') = 'array'
                    THEN ARRAY(SELECT jsonb_array_elements_text(NEW.payload -> 'output' -> 'tags'))
                    ELSE r.tags END
    WHERE r.workspace_id = NEW.workspace_id AND r.run_id = NEW.run_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER steps_set_metadata AFTER INSERT ON steps FOR EACH ROW
    WHEN (NEW.kind = 'tool_result' AND NEW.payload ->> 'tool' = 'set_metadata'
          AND NEW.payload ->> 'status' = 'ok')
    EXECUTE FUNCTION runs_metadata_on_step();

-- Active time. A hold ends when the run leaves 'running' (a commit that parks
-- or finishes it, a cancel, a failure, a hand-back: the trigger below,
-- whichever statement it is) or when another executor takes it over after its
-- lease lapsed (the claim, section 7). Either adds the hold's time, from
-- held_since to the earlier of now and the lease expiry (wake_at, while
-- running): a lapsed holder is counted up to its lease expiry, the last moment
-- it could have been working, and the time between the lapse and the takeover
-- counts for nobody.

-- Seconds of a hold that began at held_since, up to the earlier of the lease
-- expiry and now (0 when there is no hold).
CREATE FUNCTION run_held_seconds(held_since timestamptz, lease_expiry timestamptz,
                                 now timestamptz) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN held_since IS NULL THEN 0
                ELSE greatest(0, extract(epoch FROM least(lease_expiry, now) - held_since))
           END::double precision
$$;

-- A hold ended (the run left 'running', whichever statement moved it): add
-- its time and forget when it began.
CREATE FUNCTION runs_count_active_time() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.active_seconds := OLD.active_seconds + run_held_seconds(OLD.held_since, OLD.wake_at, now());
    NEW.held_since := NULL;
    RETURN NEW;
END $$;

-- UPDATE OF status: an update that does not set status (a step commit, a
-- heartbeat) skips the trigger outright, WHEN and all. No BEFORE trigger on
-- runs writes status or wake_at.
CREATE TRIGGER runs_active_time BEFORE UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION runs_count_active_time();

-- Large tool results, stored apart from the step log: the step keeps a
-- truncated view and a reference (sha256, size, media type), so no message on
-- the executor stream grows with a tool's output. Content-addressed per
-- workspace: the same bytes uploaded twice are one payload. Uploads arrive in
-- chunks, appended in order; the chunk that completes the size is checked
-- against the hash and only then is the payload row written. A payload never
-- referenced (the executor died before its commit) is harmless.
CREATE TABLE payload_chunks (
    workspace_id  text NOT NULL REFERENCES workspaces,
    sha256        text NOT NULL,
    "offset"      bigint NOT NULL,
    data          bytea NOT NULL,
    PRIMARY KEY (workspace_id, sha256, "offset"),
    CONSTRAINT payload_chunk_offset_not_negative CHECK ("offset" >= 0)
);

CREATE TABLE payloads (
    workspace_id  text NOT NULL REFERENCES workspaces,
    sha256        text NOT NULL,
    size          bigint NOT NULL,
    media_type    text NOT NULL,
    -- The run whose executor completed the upload first.
    run_id        uuid NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, sha256),
    CONSTRAINT payload_sha256_is_hex CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    CONSTRAINT payload_size_not_negative CHECK (size >= 0)
);

-- Retention: a run's payloads.
CREATE INDEX payloads_by_run ON payloads (workspace_id, run_id);


-- ===========================================================================
-- 4. Children and signals: results delivered into a parked run's log
-- ===========================================================================
--
-- Both deliver a tool call's result to a run parked on it, exactly once,
-- the same way: under the parked run's row lock, only while it still waits
-- for that (status 'waiting' and its wait_reason) and the call has no result
-- yet, they append the call's tool_result at the run's next seq under its
-- last epoch and set wake_at = now(). A parked run has no holder, so no
-- executor writes its log meanwhile, and a stale holder is fenced (its run is
-- no longer 'running' at its epoch). The executor that claims the run next
-- finds the result in its log like any other: the log stays the one source
-- of truth.

-- The run's next seq: where a step appended at the end of its log goes. Its
-- callers hold the run row's lock, so no other step can take that seq. The
-- named queries that append at the log's end use it too (steps.sql's
-- steps_append fragment is the other shared definition, for the fenced commits).
CREATE FUNCTION run_next_seq(ws text, rid uuid) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT (SELECT coalesce(max(seq), -1) + 1 FROM steps WHERE workspace_id = ws AND run_id = rid)
$$;

-- The one append both deliveries below make: the call's tool_result at the
-- run's next seq under its last epoch, counted into step_count, and the run
-- made runnable now. Returns the seq. The caller holds the run row's lock and
-- has checked that the call has no result yet.
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

-- Child runs. A run's start_child call admits another agent's run in the very
-- transaction that commits the call's tool_started step and the parent's park
-- (wait_reason 'child', no wake_at): the child does not exist until the
-- parent waits, a resent commit is acknowledged as a duplicate before
-- admitting anything, and runs_child_of stops a second child for one call.
-- A run reaches a terminal status once, and the trigger fires on that one
-- transition whichever statement makes it; a parent that ended meanwhile gets
-- nothing. Several start_child calls of one decision wait at once: the parent
-- wakes when the last of them has its result. Returns whether it delivered.
CREATE FUNCTION run_deliver_child_result(
    ws text, parent uuid, call_seq integer, child uuid, outcome text, result jsonb, err text
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held record;
    started record;
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
    SELECT payload, ref_seq INTO started FROM steps
    WHERE workspace_id = ws AND run_id = parent AND seq = call_seq AND kind = 'tool_started';
    PERFORM run_deliver_result(ws, parent, held.lease_epoch, call_seq,
            jsonb_strip_nulls(jsonb_build_object(
                'call_id', started.payload ->> 'call_id', 'tool', 'start_child',
                'status', CASE WHEN outcome = 'completed' THEN 'ok' ELSE 'error' END,
                'output', jsonb_build_object('child_run_id', child, 'status', outcome,
                                             'output', result),
                'error', CASE WHEN outcome <> 'completed' THEN coalesce(err, outcome) END)));
    IF EXISTS (SELECT 1 FROM steps s
               WHERE s.workspace_id = ws AND s.run_id = parent AND s.kind = 'tool_started'
                 AND s.ref_seq = started.ref_seq AND s.payload ->> 'tool' = 'start_child'
                 AND NOT EXISTS (SELECT 1 FROM steps r
                                 WHERE r.workspace_id = ws AND r.run_id = parent
                                   AND r.kind = 'tool_result' AND r.ref_seq = s.seq)) THEN
        UPDATE runs SET wake_at = NULL WHERE workspace_id = ws AND run_id = parent;
    END IF;
    RETURN true;
END $$;

CREATE FUNCTION run_cancel_children(ws text, parent uuid, call_seq integer, reason text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    kid record;
    n integer := 0;
BEGIN
    FOR kid IN
        SELECT run_id FROM runs
        WHERE workspace_id = ws AND parent_run_id = parent AND parent_close = 'cancel'
          AND (call_seq IS NULL OR parent_seq = call_seq)
          AND status IN ('queued', 'running', 'waiting')
        ORDER BY parent_seq, parent_index
        FOR NO KEY UPDATE
    LOOP
        UPDATE runs SET status = 'cancelled', wait_reason = NULL, wake_at = NULL,
                        lease_owner = NULL, error = reason, step_count = step_count + 1,
                        finished_at = now(), updated_at = now()
        WHERE workspace_id = ws AND run_id = kid.run_id
          AND status IN ('queued', 'running', 'waiting');
        IF FOUND THEN
            INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload)
            SELECT ws, kid.run_id, run_next_seq(ws, kid.run_id), 'finish', r.lease_epoch, NULL,
                   jsonb_build_object('status', 'cancelled', 'error', reason)
            FROM runs r WHERE r.workspace_id = ws AND r.run_id = kid.run_id;
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- The fan-in of the start_children call at call_seq: once enough of its children have
-- ended (all, the first, or n: the call's `wait`), its one tool_result with every child's
-- outcome in list order, the parent woken, and the children not waited for closed by
-- their policy. Returns whether it delivered.
CREATE FUNCTION run_deliver_fan_in(ws text, parent uuid, call_seq integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held record;
    started jsonb;
    mode text;
    total integer;
    ended integer;
    needed integer;
    outcomes jsonb;
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
    SELECT count(*), count(*) FILTER (WHERE status IN ('completed', 'failed', 'cancelled'))
    INTO total, ended FROM runs
    WHERE workspace_id = ws AND parent_run_id = parent AND parent_seq = call_seq
      AND parent_index IS NOT NULL;
    SELECT payload INTO started FROM steps
    WHERE workspace_id = ws AND run_id = parent AND seq = call_seq AND kind = 'tool_started';
    mode := coalesce(started -> 'arguments' ->> 'wait', 'all');
    needed := CASE mode
        WHEN 'first' THEN 1
        WHEN 'n' THEN least(coalesce((started -> 'arguments' ->> 'n')::integer, total), total)
        ELSE total END;
    IF total = 0 OR ended < needed THEN
        RETURN false;
    END IF;
    SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
               'index', r.parent_index, 'child_run_id', r.run_id, 'agent_id', r.agent_id,
               'status', CASE WHEN r.status IN ('completed', 'failed', 'cancelled') THEN r.status
                              WHEN r.parent_close = 'cancel' THEN 'cancelled'
                              ELSE r.status END,
               'output', r.output, 'error', r.error))
           ORDER BY r.parent_index)
    INTO outcomes FROM runs r
    WHERE r.workspace_id = ws AND r.parent_run_id = parent AND r.parent_seq = call_seq
      AND r.parent_index IS NOT NULL;
    PERFORM run_deliver_result(ws, parent, held.lease_epoch, call_seq,
            jsonb_build_object(
                'call_id', started ->> 'call_id', 'tool', 'start_children', 'status', 'ok',
                'output', jsonb_build_object('wait', mode, 'ended', ended,
                                             'children', outcomes)));
    PERFORM run_cancel_children(ws, parent, call_seq, 'not waited for: the parent went on');
    RETURN true;
END $$;

-- A start_children call that admitted nothing (an entry names no published agent, an
-- input out of bounds): its error result at once, and the parent woken.
CREATE FUNCTION run_deliver_fan_refused(ws text, parent uuid, call_seq integer, err text)
RETURNS boolean
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
            jsonb_build_object('call_id', started ->> 'call_id', 'tool', 'start_children',
                               'status', 'error', 'error', err));
    RETURN true;
END $$;

CREATE FUNCTION runs_child_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.parent_index IS NOT NULL THEN
        PERFORM run_deliver_fan_in(NEW.workspace_id, NEW.parent_run_id, NEW.parent_seq);
    ELSE
        PERFORM run_deliver_child_result(NEW.workspace_id, NEW.parent_run_id, NEW.parent_seq,
                                         NEW.run_id, NEW.status, to_jsonb(NEW.output),
                                         NEW.error);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_child_finish AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.parent_run_id IS NOT NULL
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_child_on_finish();

-- Parent-close policy: a parent marked closes_children cancels its open children
-- whose policy is cancel on its one terminal transition, in that transaction.
CREATE FUNCTION runs_close_children_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM run_cancel_children(NEW.workspace_id, NEW.run_id, NULL,
                                'parent run ' || NEW.status);
    RETURN NULL;
END $$;

CREATE TRIGGER runs_close_children AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.closes_children
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_close_children_on_finish();

-- Signals. SignalRun delivers a named event to a run, idempotent by its event
-- id; the run's wait_for_signal call parks it (wait_reason 'signal', no
-- wake_at or the call's timeout) and a signal is that call's result, exactly
-- once. A run's signals are a mailbox: each is stored when it arrives,
-- whatever the run is doing, and answers at most one wait_for_signal call of
-- its name, oldest first (consumed_seq names the call). Whatever arrives
-- first:
--   * Both writers hold the run row's lock when they deliver: SignalRun locks
--     it (FOR NO KEY UPDATE) before it inserts the signal and delivers; the
--     park commit's run_commit locks it, and the delivery runs in that same
--     transaction (control_plane/runs/signals.py). Deliveries of a run are
--     therefore serial.
--   * A signal that arrives while the run is held (before it parks, or while
--     its park commit is in flight) finds no waiting run and is only stored;
--     the park commit, which waited for the row lock, then reads it (a new
--     statement, a new snapshot) and delivers it.
--   * A signal that arrives after the park finds the run waiting and delivers
--     itself.
--   * A timeout that woke the run first: its next executor records the
--     timeout as the result; a signal arriving meanwhile stays in the mailbox
--     and answers the next wait of its name.
CREATE TABLE run_signals (
    workspace_id    text NOT NULL,
    run_id          uuid NOT NULL,
    -- The sender's id for the event: a second SignalRun with it is the same event.
    event_id        text NOT NULL
        CONSTRAINT run_signals_event_id_check CHECK (length(event_id) BETWEEN 1 AND 200),
    name            text NOT NULL
        CONSTRAINT run_signals_name_check CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    payload         jsonb NOT NULL,
    payload_sha256  bytea NOT NULL
        CONSTRAINT run_signals_payload_sha256_check CHECK (length(payload_sha256) = 32),
    sent_by         text NOT NULL,
    arrival         bigserial,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- The wait_for_signal call it answered (its tool_started seq), and its result's seq.
    consumed_seq    integer,
    result_seq      integer,
    consumed_at     timestamptz,
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

-- Deliver the oldest pending signal to the run's open wait_for_signal call,
-- if the run waits on a signal and one of that call's name is pending.
-- Returns the result's seq, or NULL. The caller holds the run row's lock (it
-- is taken here too, for callers that do not).
CREATE FUNCTION run_deliver_signal(ws text, rid uuid) RETURNS integer
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


-- ===========================================================================
-- 5. Running counts and next wake
-- ===========================================================================
--
-- So that the claim reads a few small rows instead of counting runs, the
-- database keeps two summaries exact on every way a run changes:
--   * the running counts: the runs executors hold, per workspace and per
--     agent;
--   * workspace_turns.next_wake_at: a lower bound on the earliest wake_at of
--     the workspace's queued or waiting runs and of its leases' ends.
--
-- Each running count is the sum of a few small rows, split by who may write
-- them:
--   * shard 0 takes the increments. A run enters 'running' only by a claim
--     or the fast path (sql/sessions.sql fast_path_lease), both under the
--     workspace's row lock, so only the lock holder ever writes it:
--     increments never wait for anyone, and the caps argument of section 7
--     holds (a count only grows under that lock; the next claim's new
--     statement sees it).
--   * shards 1..8 take the decrements, by the writer's backend (pid mod 8):
--     finishes never touch the workspace row or shard 0, so they wait neither
--     for claims nor, mostly, for each other, and never deadlock with them. A
--     decrement not yet committed only makes a claim more careful.
-- A shard may go negative; the sum is exact. bigint: the sums stay small, the
-- parts only grow, and they would take centuries to overflow. fillfactor 50:
-- every change is an update of n, kept HOT.

CREATE TABLE workspace_running_counts (
    workspace_id  text NOT NULL,
    shard         smallint NOT NULL
        CONSTRAINT workspace_running_counts_shard_check CHECK (shard BETWEEN 0 AND 8),
    n             bigint NOT NULL,
    PRIMARY KEY (workspace_id, shard)
) WITH (fillfactor = 50);

CREATE TABLE agent_running_counts (
    workspace_id  text NOT NULL,
    agent_id      text NOT NULL,
    shard         smallint NOT NULL
        CONSTRAINT agent_running_counts_shard_check CHECK (shard BETWEEN 0 AND 8),
    n             bigint NOT NULL,
    PRIMARY KEY (workspace_id, agent_id, shard)
) WITH (fillfactor = 50);

-- The sums (the claim reads them inline: an index range of at most 9 rows).
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

-- Lower a workspace's next_wake_at to `wake`. The KEY SHARE lock, held until
-- the transaction ends, is what keeps a claim from raising next_wake_at past a
-- run it cannot see yet (the claim raises only under FOR UPDATE, which
-- conflicts with it); the UPDATE runs on a snapshot taken after the lock.
CREATE FUNCTION workspace_lower_next_wake(ws text, wake timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM workspace_turns WHERE workspace_id = ws FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO workspace_turns (workspace_id, next_wake_at) VALUES (ws, wake)
        ON CONFLICT (workspace_id) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
        PERFORM 1 FROM workspace_turns WHERE workspace_id = ws FOR KEY SHARE;
    END IF;
    UPDATE workspace_turns SET next_wake_at = wake
    WHERE workspace_id = ws AND (next_wake_at IS NULL OR next_wake_at > wake);
END $$;

-- One run changed status or wake time: move the running counts, and lower
-- next_wake_at for a run that waits with a wake time (as wake-ups do: KEY
-- SHARE, then an update only when it lowers it; a finish does not write the
-- workspace row at all).
CREATE FUNCTION runs_fair_on_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    delta integer := (NEW.status = 'running')::int - (OLD.status = 'running')::int;
    pending_wake timestamptz := CASE
        WHEN NEW.status IN ('queued', 'waiting') THEN NEW.wake_at
        WHEN NEW.status = 'running'
             AND (OLD.status IS DISTINCT FROM 'running' OR NEW.wake_at < OLD.wake_at)
        THEN NEW.wake_at END;
BEGIN
    IF delta <> 0 THEN
        PERFORM running_counts_add(NEW.workspace_id, NEW.agent_id, delta);
    END IF;
    IF pending_wake IS NOT NULL THEN
        PERFORM workspace_lower_next_wake(NEW.workspace_id, pending_wake);
    END IF;
    RETURN NULL;
END $$;

-- Considered only by updates that set status or wake_at (UPDATE OF: every
-- update that changes them sets them; a step commit that keeps its lease
-- names neither and skips the trigger, WHEN and all). The runs a claim leases
-- fresh are left out while agentrun.claim_counts is on: agentrun_claim()
-- counts them itself, once per workspace and agent (section 7).
CREATE TRIGGER runs_fair_update AFTER UPDATE OF status, wake_at ON runs FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           OR (NEW.status IN ('queued', 'waiting') AND NEW.wake_at IS DISTINCT FROM OLD.wake_at)
           OR (NEW.status = 'running' AND NEW.wake_at < OLD.wake_at))
          AND NOT (NEW.status = 'running' AND OLD.status IS DISTINCT FROM 'running'
                   AND coalesce(current_setting('agentrun.claim_counts', true), '') = 'on'))
    EXECUTE FUNCTION runs_fair_on_update();

-- Admissions, once per statement: a bulk import touches each workspace once.
CREATE FUNCTION runs_fair_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    due record;
BEGIN
    FOR due IN
        SELECT workspace_id, min(wake_at) AS wake FROM inserted
        WHERE status IN ('queued', 'waiting', 'running') AND wake_at IS NOT NULL
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

CREATE TRIGGER runs_fair_insert AFTER INSERT ON runs REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION runs_fair_on_insert();

-- A run deleted while running leaves the counts.
CREATE FUNCTION runs_fair_on_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM running_counts_add(OLD.workspace_id, OLD.agent_id, -1);
    RETURN NULL;
END $$;

CREATE TRIGGER runs_fair_delete AFTER DELETE ON runs FOR EACH ROW
    WHEN (OLD.status = 'running') EXECUTE FUNCTION runs_fair_on_delete();

-- TRUNCATE fires no row triggers: with no runs left, nothing runs or is due.
CREATE FUNCTION runs_fair_on_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workspace_running_counts;
    DELETE FROM agent_running_counts;
    UPDATE workspace_turns SET next_wake_at = NULL WHERE next_wake_at IS NOT NULL;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_fair_truncate AFTER TRUNCATE ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION runs_fair_on_truncate();


-- ===========================================================================
-- 6. Executors and releases
-- ===========================================================================

-- The executors connected now and the tools each carries, so that publishing
-- an agent version with a tool nobody can run is refused on every replica.
-- One row per executor (its id is stable for the process's life), written by
-- its Hello and refreshed by the replica holding its stream every heartbeat
-- interval; a clean disconnect deletes it. A row is live while last_seen is
-- recent (control_plane/tools/registry.py): an executor killed -9 stops
-- counting once its row goes stale. Not a tenant table: executors are the
-- platform's; `scope` is the workspaces its credential serves (NULL: all).
CREATE TABLE executor_tools (
    executor_id   text PRIMARY KEY,
    -- The stream (ExecutorSession.id) that wrote the row: a disconnect deletes
    -- only its own row, never one a reconnect to another replica wrote since.
    session_id    text NOT NULL,
    release       text NOT NULL DEFAULT '',
    scope         text[],
    -- [{"name", "version", "schema_sha256", "capabilities": [...]}, ...]
    tools         jsonb NOT NULL DEFAULT '[]'
        CONSTRAINT executor_tools_tools_check CHECK (jsonb_typeof(tools) = 'array'),
    connected_at  timestamptz NOT NULL DEFAULT now(),
    last_seen     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX executor_tools_live ON executor_tools (last_seen);
CREATE INDEX executor_tools_by_release ON executor_tools (release, last_seen);

-- Releases. A run is pinned to a release (runs.release) only while a turn is
-- in progress on it; a parked run waits on none and continues on the newest
-- open release: connected, not draining, and under the canary gate past its
-- canary (release_opened); the latest promoted one, else the one first seen
-- last; a ramped release takes its percentage of the runs on none
-- (release_share). Moving a pinned run to another release is an operator's
-- explicit, audited act (ReleaseService.MoveRunRelease).
CREATE TABLE releases (
    release           text PRIMARY KEY CONSTRAINT releases_release_check CHECK (release <> ''),
    -- When an executor of this release first connected: the default order of "newest".
    first_seen_at     timestamptz NOT NULL DEFAULT now(),
    -- An operator's explicit promote: a promoted release is newer than any first seen.
    promoted_at       timestamptz,
    -- A drain (ReleaseService.DrainRelease): its executors claim nothing new, work
    -- on what they hold until drain_deadline (NULL: each one's longest turn), then
    -- hand each run back at its next turn boundary (drain_forced: even mid-turn).
    draining_since    timestamptz,
    drain_deadline    timestamptz,
    -- When a canary pinned to this release last passed, and last failed (with the
    -- failing stage and why). With AGENTRUN_RELEASE_GATE=canary (the default) a
    -- release takes new runs only once past a canary since its last failure.
    canary_passed_at  timestamptz,
    canary_failed_at  timestamptz,
    canary_failure    text,
    -- RampRelease: the share of the runs on no release it takes (release_share).
    ramp_percent      integer
        CONSTRAINT releases_ramp_percent_check CHECK (ramp_percent BETWEEN 0 AND 100),
    rolled_back_at    timestamptz,
    drain_forced      boolean NOT NULL DEFAULT false,
    -- The step-log versions its executors write and read from (Hello): a run on no
    -- release goes only to a release that reads its log (release_share).
    log_version       integer NOT NULL DEFAULT 1,
    log_reads_from    integer NOT NULL DEFAULT 1,
    -- A replica runs the release's self-check canary until this time (NULL or
    -- past: nobody does), started by the connect of executor canary_check_by
    -- (control_plane/deploys/self_check.py): one check at a time per release.
    canary_check_until timestamptz,
    canary_check_by   text
);


-- ===========================================================================
-- 7. The claim
-- ===========================================================================
--
-- run_claim (sql/lease.sql) hands runs to a dispatcher's free executor slots
-- with one call of agentrun_claim(): one statement in its own transaction,
-- one round trip. It runs in parts that Citus can place (0047): the turns on
-- the coordinator (workspace_turns, section 1), the lease on each shard
-- holding one of them (agentrun_claim_shard()), the marks on the coordinator.
-- Plain PostgreSQL is one shard (agentrun_shard_of() is 0). In order:
--
--   0. fold the due wakes the shards lowered (workspace_wakes: only under
--      Citus, where a trigger on a shard cannot reach workspace_turns);
--   1. take turns: lock the workspaces whose turn it is (least recently
--      served first, next_wake_at passed, up to one per owner left), FOR NO
--      KEY UPDATE SKIP LOCKED;
--   2. per shard, in the order of its first turn, with a share of the owners
--      left as large as its share of the turns: a. lock their workspaces rows
--      (FOR NO KEY UPDATE SKIP LOCKED, as the fast path locks them), then read
--      their counts; b. lease their lapsed runs first (they hold their slot
--      already), then the due runs of those whose queue is not paused, round
--      robin, one per workspace per round, within the room of each workspace
--      and of each agent; within a workspace, highest priority first, then
--      oldest due; count the fresh runs. Up to three more rounds of 1 and 2
--      while owners are left and the turns filled their limit;
--   3. mark the served turns (to the back of the line);
--   4. raise next_wake_at of the workspaces the claim may have emptied: lock
--      those no writer holds (FOR UPDATE SKIP LOCKED), then read their first
--      due run and first lease end.
--
-- Each step is its own statement, so each takes a fresh snapshot (the
-- functions are VOLATILE and the transaction READ COMMITTED): "a new
-- statement" below means a snapshot taken after the locks of the steps before
-- it were granted. The locks are kept until the calling statement's
-- transaction ends. The lease step's SET clauses plan its statements
-- generically, with nested loops only: the plans do not depend on the arrays
-- given (every step is an index probe), a generic plan cannot know how few
-- runs a claim takes (its LIMITs are parameters), and with a million parked
-- runs a hash join might read the whole runs table for the final UPDATE.
-- (Citus prunes `workspace_id = ANY(...)` to one shard only with the values in
-- the plan: `migrate --citus` makes it plan per call there.)
--
-- Step 2b in detail. It reads each agent's share of the batch first (the
-- batch over the workspaces in turn, rounded up, and one more, which tells a
-- workspace that keeps due runs from one the claim may empty), and up to the
-- whole batch only when that falls short (`short`): otherwise every run the
-- round robin picks is among the first min(share, room) of its workspace,
-- which the first pass read in full, so the picks are the same either way.
-- An agent's due runs are read highest priority first, each level oldest
-- first, without reading its parked runs (runs_due_by_priority): on Postgres
-- 18 and later by one skip scan, which searches the index once per priority
-- level up to the level's first run not yet due; before 18, by a walk over
-- the levels, one index descent to find each level and one range probe that
-- stops at its first run not yet due (the LIMIT stops the walk once it has
-- enough: lower levels are not even looked up). The picks are cut from the
-- candidates in order of their turn in their workspace, then of the
-- workspace's place in the line, so a workspace's picks are its first turns:
-- it keeps a due run unless its last candidate was picked. A workspace that
-- got a run, or had none these owners could take (its agents at their caps,
-- its own cap, its queue paused, tools the owners do not carry, another
-- release), goes to the back of the line; one that lost out only to a full
-- batch keeps its place. The coordinator does not know the caps or a paused
-- queue: such a workspace takes its turn and spends it, and the raise moves a
-- paused queue past its queued runs (resuming lowers it again).
--
-- Lapsed leases. A lapsed lease is taken over at its workspace's turn, by the
-- lease step of its shard: next_wake_at is a lower bound on the workspace's
-- leases' ends too (the raise reads the first one; a lease begun outside the
-- claim, the fast path's, or cut short, a release on break, lowers it). A
-- workspace holding runs therefore takes a turn about once a lease, and goes
-- back to the end of the line when nothing lapsed.
--
-- Why caps hold with any number of claimers. A workspace's running count only
-- grows in step 2b, under the workspaces row lock taken in step 2a (and by the
-- fast path under the same lock), kept until commit; step 2b is a new
-- statement, so its snapshot sees every claim that held that lock before.
-- Other claimers skip the locked rows (SKIP LOCKED) and never wait. Counts only
-- shrink elsewhere (commits, cancels), which can only make a claim more careful
-- than it needs to be, never less.
--
-- Raising next_wake_at. Admissions and wake-ups lower it while holding KEY
-- SHARE on the turn row until they commit (workspace_lower_next_wake), which
-- step 1's FOR NO KEY UPDATE does not conflict with: a 50k import never holds
-- claims up. Raising it is only safe with no such writer in flight, so step 4
-- takes FOR UPDATE (SKIP LOCKED: if a writer is in flight, the raise waits for
-- a later claim), and its read, a new statement, then sees every run those
-- writers added; writers that come later wait for the claim to commit and
-- lower the raised value again. Under Citus the writers lower workspace_wakes
-- on their shard instead, in their own transaction; a row stays there until a
-- claim has folded exactly its value (step 0 deletes nothing a writer holds
-- or changed), so a raise never hides a run: the next claim lowers it again.
--
-- The counts. agentrun_claim_shard() adds the runs step 2b leased fresh (a
-- lapsed lease taken over was 'running' already) to shard 0 of their
-- workspace's and their agent's running counts, by two statements in key
-- order, right after the lease in the same transaction. That order cannot
-- deadlock: shard 0 of a workspace is written only by the holder of the
-- workspace's row lock. Its SET clause turns agentrun.claim_counts on, and the
-- row trigger runs_fair_update leaves the runs entering 'running' to it: each
-- is counted once, and a batch costs two statements instead of two row
-- updates per run. The setting is off again when it returns or fails, so every
-- other status change, the fast path's lease included, is counted by the
-- trigger. (On Citus the trigger fires on the worker, which does not see the
-- setting: `migrate --citus` turns it off for the function, and the trigger
-- counts.)
--
-- others_due. Step 1 passes over a workspace another claimer holds, so a
-- claim may come back short while runs are due and executors idle. Before the
-- claim, agentrun_claim() reads step 1's turns without the lock. Step 3 marks
-- every workspace it served at the claim's clock (one value for the whole
-- transaction); the one that lost out only to a full batch keeps its place,
-- but then the claim was not short. So when the claim took fewer runs than it
-- had owners, a workspace of that read which is not marked, and is still due
-- with room and its queue open, is one step 1 passed over because another
-- claimer held it (or one that claimer served meanwhile and left with due
-- runs): there is a run to take now. A last row, its run NULL and others_due
-- true, says so, and the dispatcher claims again at once instead of waiting
-- for its next poke or poll. The read after the claim is a new statement: it
-- sees the other claimers' commits and step 4's raise. Neither read locks
-- anything or changes a count, so the caps argument is untouched.
--
-- Whether a release is open to new runs under the canary gate: past a canary (or
-- promoted) since its last canary failure.
CREATE FUNCTION release_opened(passed timestamptz, failed timestamptz, promoted timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN failed IS NULL THEN passed IS NOT NULL OR promoted IS NOT NULL
                ELSE coalesce(greatest(passed, promoted) > failed, false) END
$$;

-- The share [lo, hi) of the runs on no release (by release_takes' bucket) that the
-- executors of release `own` take, and the step-log versions it reads (reads_from to
-- writes): the newest open release not ramped takes all but the ramped one's
-- percentage, the newest ramped release takes its percentage (all, if no release is
-- open besides it), every other release none. Open: connected (seen within `live`
-- seconds; the claimers themselves count), not draining, and with `gated`, past its
-- canary (release_opened). Always exactly one row (own NULL: no share, every version).
CREATE FUNCTION release_share(own text, live double precision, gated boolean)
RETURNS TABLE (lo integer, hi integer, reads_from integer, writes integer) LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH open AS (
        SELECT rl.release, rl.ramp_percent, coalesce(rl.promoted_at, rl.first_seen_at) AS since
        FROM releases rl
        WHERE rl.draining_since IS NULL
          AND (NOT gated OR release_opened(rl.canary_passed_at, rl.canary_failed_at,
                                           rl.promoted_at))
          AND (rl.release = own OR EXISTS (
            SELECT 1 FROM executor_tools e
            WHERE e.release = rl.release AND e.last_seen > now() - make_interval(secs => live)))
    ), main AS (
        SELECT release FROM open WHERE ramp_percent IS NULL
        ORDER BY since DESC, release DESC LIMIT 1
    ), ramp AS (
        SELECT release, ramp_percent FROM open WHERE ramp_percent IS NOT NULL
        ORDER BY since DESC, release DESC LIMIT 1
    )
    SELECT CASE WHEN own = (SELECT release FROM main)
                THEN coalesce((SELECT ramp_percent FROM ramp), 0) ELSE 0 END,
           CASE WHEN own = (SELECT release FROM main) THEN 100
                WHEN own = (SELECT release FROM ramp)
                THEN CASE WHEN EXISTS (SELECT 1 FROM main) THEN (SELECT ramp_percent FROM ramp)
                          ELSE 100 END
                ELSE 0 END,
           coalesce((SELECT rl.log_reads_from FROM releases rl WHERE rl.release = own), 0),
           coalesce((SELECT rl.log_version FROM releases rl WHERE rl.release = own), 2147483647)
;
END $$;

-- Whether a run on no release falls in the share [lo, hi): its bucket, 0..99, is a
-- hash of its id, so a run keeps its side of a ramp for as long as the ramp stands.
CREATE FUNCTION release_takes(run_id uuid, lo integer, hi integer)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT lo < hi AND (hi - lo >= 100 OR (hashtext(run_id::text) & 2147483647) % 100 >= lo
                                          AND (hashtext(run_id::text) & 2147483647) % 100 < hi)
$$;

-- agentrun_claim_shard(): the lease step on one shard, for the turns `ids`
-- (all on it) taken on the coordinator: a. lock their workspace rows, b. take
-- their lapsed leases and their due runs round robin within the caps, count
-- the fresh ones. Returns each claimed run, then a row per locked workspace
-- (run NULL): whether it was served and whether it may be empty. The DO block
-- creates it with the read of an agent's due runs the server does best (0037).
DO $claim_walk$
DECLARE
    -- Before Postgres 18: the walk over priority levels.
    levels constant text := $levels$
            WITH RECURSIVE levels(priority) AS (
                (SELECT r.priority FROM runs r
                 WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                  AND r.workspace_id = ANY(turn_ids::text[])
                   AND r.status IN ('queued', 'waiting')
                 ORDER BY r.priority DESC LIMIT 1)
                UNION ALL
                SELECT (SELECT r.priority FROM runs r
                        WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                  AND r.workspace_id = ANY(turn_ids::text[])
                          AND r.status IN ('queued', 'waiting') AND r.priority < l.priority
                        ORDER BY r.priority DESC LIMIT 1)
                FROM levels l WHERE l.priority IS NOT NULL
            )
            SELECT d.run_id, l.priority, d.wake_at
            FROM levels l
            CROSS JOIN LATERAL (
                SELECT r.run_id, r.wake_at FROM runs r
                WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                  AND r.workspace_id = ANY(turn_ids::text[])
                  AND r.priority = l.priority
                  AND r.status IN ('queued', 'waiting') AND r.wake_at <= (SELECT now FROM clock)
                  AND NOT r.paused
                  AND ((SELECT any_release FROM routing) OR r.release = ANY($6::text[])
                       OR (r.release IS NULL
                           AND release_takes(r.run_id, (SELECT lo FROM routing), (SELECT hi FROM routing))
                           AND r.log_version BETWEEN (SELECT reads_from FROM routing)
                                                 AND (SELECT writes FROM routing)))
                  AND ($5::jsonb IS NULL OR EXISTS (
                      SELECT 1 FROM agent_versions v
                      WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                        AND v.workspace_id = ANY(locked::text[])
                        AND v.version = r.agent_version
                        AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $5::jsonb))
                ORDER BY r.wake_at, r.run_id
                LIMIT q.runs
            ) d
            LIMIT q.runs
$levels$;
    -- Postgres 18 and later: the same runs in the same order, by a skip scan
    -- of runs_due_by_priority.
    skip_scan constant text := $skip_scan$
            SELECT r.run_id, r.priority, r.wake_at FROM runs r
            WHERE r.workspace_id = q.workspace_id AND r.agent_id = q.agent_id
                  AND r.workspace_id = ANY(turn_ids::text[])
              AND r.status IN ('queued', 'waiting') AND r.wake_at <= (SELECT now FROM clock)
                  AND NOT r.paused
              AND ((SELECT any_release FROM routing) OR r.release = ANY($6::text[])
                   OR (r.release IS NULL
                       AND release_takes(r.run_id, (SELECT lo FROM routing), (SELECT hi FROM routing))
                       AND r.log_version BETWEEN (SELECT reads_from FROM routing)
                                             AND (SELECT writes FROM routing)))
              AND ($5::jsonb IS NULL OR EXISTS (
                  SELECT 1 FROM agent_versions v
                  WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                        AND v.workspace_id = ANY(locked::text[])
                    AND v.version = r.agent_version
                    AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $5::jsonb))
            ORDER BY r.priority DESC, r.wake_at, r.run_id
            LIMIT q.runs
$skip_scan$;
BEGIN
    EXECUTE replace($function$
CREATE FUNCTION agentrun_claim_shard(
    owners text[], lease_seconds double precision, at timestamptz, ids text[],
    carried jsonb, continued text[], own_release text, live_seconds double precision,
    gated boolean)
RETURNS TABLE (run runs, held_seconds double precision, taken_over boolean, keeps_due boolean,
               metered boolean, workspace_id text, served boolean, maybe_empty boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_hashjoin = off
SET enable_mergejoin = off
SET agentrun.claim_counts = 'on'
AS $claim$
-- The result's columns are variables too: in the statements the names mean
-- the columns they always meant.
#variable_conflict use_column
DECLARE
    locked text[];
    caps integer[];
    counted text[];
    running numeric[];
    rooms bigint[];
    turn_ids text[];
    gone text[];
    share_lo integer;
    share_hi integer;
    share_reads integer;
    share_writes integer;
    metered_ids text[];
    served_ids text[];
    out_runs runs[];
    out_held double precision[];
    out_taken boolean[];
    out_keeps boolean[];
BEGIN
    -- a. Lock the turns' workspace rows here, beside their runs and counts, as
    -- the fast path locks them, skipping those another claimer or a fast path
    -- holds. A workspace whose queue is paused is locked (its lapsed leases are
    -- taken over) but gets no fresh run. Then, a new statement, their room
    -- under the cap (step b reads it again). Citus locks rows of one shard
    -- only by a statement over that table alone: the counts are read apart.
    SELECT array_agg(t.workspace_id ORDER BY t.ord), array_agg(t.max_concurrency ORDER BY t.ord),
           array_agg(t.workspace_id ORDER BY t.ord) FILTER (WHERE NOT t.queue_paused)
    INTO locked, caps, turn_ids
    FROM (
        SELECT w.workspace_id, l.ord, w.queue_paused, w.max_concurrency
        FROM workspaces w
        JOIN unnest($4::text[]) WITH ORDINALITY AS l(workspace_id, ord) USING (workspace_id)
        WHERE w.workspace_id = ANY($4::text[])
        FOR NO KEY UPDATE OF w SKIP LOCKED
    ) t;
    SELECT array_agg(c.workspace_id), array_agg(c.running) INTO counted, running
    FROM (SELECT c.workspace_id, sum(c.n) AS running FROM workspace_running_counts c
          WHERE c.workspace_id = ANY(locked) GROUP BY c.workspace_id) c;
    SELECT array_agg(l.cap - coalesce(c.running, 0) ORDER BY l.ord) INTO rooms
    FROM unnest(locked, caps) WITH ORDINALITY AS l(workspace_id, cap, ord)
    LEFT JOIN unnest(counted, running) AS c(workspace_id, running) USING (workspace_id);
    locked := coalesce(locked, '{}');
    rooms := coalesce(rooms, '{}');
    turn_ids := coalesce(turn_ids, '{}');
    -- Turns of workspaces that no longer exist: served, and raised to nothing.
    IF cardinality(locked) < cardinality($4) THEN
        SELECT array_agg(g.workspace_id) INTO gone FROM unnest($4::text[]) AS g(workspace_id)
        WHERE g.workspace_id <> ALL(locked) AND NOT EXISTS (
            SELECT 1 FROM workspaces w
            WHERE w.workspace_id = g.workspace_id AND w.workspace_id = ANY($4::text[]));
    END IF;
    -- The share of the runs on no release that these owners take (release_share), a
    -- statement of its own: Citus plans no SQL function over its tables inside
    -- the lease statement.
    -- Owners of no release: no share, every version (what release_share says).
    IF $7 IS NULL THEN
        share_lo := 0; share_hi := 0; share_reads := 0; share_writes := 2147483647;
    ELSE
        SELECT s.lo, s.hi, s.reads_from, s.writes
        INTO share_lo, share_hi, share_reads, share_writes
        FROM release_share($7, $8, $9) s;
    END IF;
    -- None locked (every turn held by another claimer, or gone): nothing to lease.
    -- Citus cannot route the lease statement's locks over an empty array.
    IF cardinality(locked) = 0 THEN
        RETURN QUERY
            SELECT NULL::runs, NULL::double precision, NULL::boolean, NULL::boolean,
                   NULL::boolean, g.workspace_id, true, true
            FROM unnest(gone) AS g(workspace_id);
        RETURN;
    END IF;
    -- b. Lapsed leases of the locked workspaces first, then the due runs of those
    -- open to them, round robin, within each workspace's and agent's room
    -- (schema.sql section 7 says how).
    WITH clock AS MATERIALIZED (
        SELECT coalesce($3::timestamptz, now()) AS now
    ), routing AS MATERIALIZED (
        -- The share of the runs on no release that these owners take (read above).
        SELECT $6::text[] IS NULL AS any_release, share_lo AS lo, share_hi AS hi,
               share_reads AS reads_from, share_writes AS writes
    ), lapsed AS (
        SELECT r.workspace_id, r.run_id FROM runs r
        WHERE r.status = 'running' AND r.wake_at <= (SELECT now FROM clock) AND NOT r.paused
          AND r.workspace_id = ANY(locked::text[])
          AND ((SELECT any_release FROM routing) OR r.release = ANY($6::text[])
               OR (r.release IS NULL
                   AND release_takes(r.run_id, (SELECT lo FROM routing), (SELECT hi FROM routing))
                   AND r.log_version BETWEEN (SELECT reads_from FROM routing)
                                         AND (SELECT writes FROM routing)))
          AND ($5::jsonb IS NULL OR EXISTS (
              SELECT 1 FROM agent_versions v
              WHERE v.workspace_id = r.workspace_id AND v.agent_id = r.agent_id
                        AND v.workspace_id = ANY(locked::text[])
                AND v.version = r.agent_version
                AND coalesce(v.code_tools, v.spec -> 'tools', '[]'::jsonb) <@ $5::jsonb))
        ORDER BY r.wake_at
        LIMIT cardinality($1::text[])
        FOR UPDATE SKIP LOCKED
    ), turns AS (
        -- The running counts (0027_running_counts.sql), read by this statement's
        -- snapshot: it sees every claim that held the workspace's lock before.
        SELECT w.workspace_id, l.ord, w.max_concurrency - c.running AS room
        FROM unnest(turn_ids::text[]) WITH ORDINALITY AS l(workspace_id, ord)
        JOIN workspaces w USING (workspace_id)
        CROSS JOIN LATERAL (
            SELECT coalesce(sum(n), 0) AS running FROM workspace_running_counts c
            WHERE c.workspace_id = w.workspace_id AND c.workspace_id = ANY(turn_ids::text[])) c
        WHERE w.workspace_id = ANY(turn_ids::text[]) AND c.running < w.max_concurrency
    ), agent_rooms AS (
        SELECT t.workspace_id, t.ord, t.room, a.agent_id, ar.room AS agent_room
        FROM turns t
        JOIN agents a ON a.workspace_id = t.workspace_id AND a.workspace_id = ANY(turn_ids::text[])
        -- NULL: no cap of its own (least() below then ignores it).
        CROSS JOIN LATERAL (
            SELECT CASE WHEN a.max_concurrency IS NOT NULL THEN greatest(0, a.max_concurrency - (
                SELECT coalesce(sum(n), 0) FROM agent_running_counts ac
                WHERE ac.workspace_id = a.workspace_id AND ac.agent_id = a.agent_id
                  AND ac.workspace_id = ANY(turn_ids::text[]))) END AS room
        ) ar
        WHERE (ar.room IS NULL OR ar.room > 0) AND NOT a.paused
    ), share AS MATERIALIZED (
        -- The batch left after the lapsed leases, and the runs of each agent the round
        -- robin can need when every workspace in turn has that many: the batch over the
        -- workspaces, rounded up, and one more, which tells a workspace that keeps due
        -- runs after this claim from one it may empty.
        SELECT b.left, ceil(greatest(b.left, 1)::numeric / greatest(
                   (SELECT count(*) FROM turns), 1))::int + 1 AS runs
        FROM (SELECT cardinality($1::text[]) - (SELECT count(*) FROM lapsed) AS left) b
    ), first_pass AS (
        -- Each agent's first runs, up to its share: with 64 workspaces in turn and a batch
        -- of 64, two runs each instead of 64 (never more than the batch: a workspace with
        -- vast room must not make a one-run claim read its whole backlog).
        SELECT q.workspace_id, q.ord, q.room, c.run_id, c.priority, c.wake_at
        FROM (SELECT r.*, least(r.room, r.agent_room, (SELECT runs FROM share)) AS runs
              FROM agent_rooms r) q
        CROSS JOIN LATERAL (
            /* the agent's due runs */
        ) c
    ), short AS MATERIALIZED (
        -- Whether the first pass may have left out a run the round robin takes: it has
        -- fewer than the batch left within min(share, room) of each workspace (some had
        -- fewer due runs than their share). Otherwise every run picked is among the first
        -- min(share, room) of its workspace, which the first pass read in full, so the
        -- picks are exactly those a pass reading up to the batch would make.
        SELECT coalesce(sum(least(f.n, f.room, (SELECT runs FROM share))), 0)
               < (SELECT s.left FROM share s) AS short
        FROM (SELECT workspace_id, room, count(*) AS n FROM first_pass
              GROUP BY workspace_id, room) f
    ), second_pass AS (
        -- Only when short: every agent's first runs up to the batch (never more).
        SELECT q.workspace_id, q.ord, q.room, c.run_id, c.priority, c.wake_at
        FROM (SELECT r.*, least(r.room, r.agent_room, cardinality($1::text[])) AS runs
              FROM agent_rooms r WHERE (SELECT short FROM short)) q
        CROSS JOIN LATERAL (  -- the same as first_pass's
            /* the agent's due runs */
        ) c
    ), candidates AS (
        SELECT * FROM first_pass WHERE NOT (SELECT short FROM short)
        UNION ALL
        SELECT * FROM second_pass
    ), picked AS (
        -- turn: the candidate's place in its workspace; n: how many it has there.
        SELECT workspace_id, run_id, turn, n FROM (
            SELECT workspace_id, run_id, ord, room,
                   row_number() OVER (PARTITION BY workspace_id
                                      ORDER BY priority DESC, wake_at, run_id) AS turn,
                   count(*) OVER (PARTITION BY workspace_id) AS n
            FROM candidates
        ) ranked
        WHERE turn <= room
        ORDER BY turn, ord
        LIMIT cardinality($1::text[]) - (SELECT count(*) FROM lapsed)
    ), fresh AS (
        -- One primary-key probe per picked run, whatever the statistics say:
        -- joined any other way, the planner may walk every due run instead.
        SELECT r.workspace_id, r.run_id
        FROM picked p
        CROSS JOIN LATERAL (
            SELECT r.workspace_id, r.run_id FROM runs r
            WHERE r.workspace_id = p.workspace_id AND r.run_id = p.run_id
              AND r.workspace_id = ANY(turn_ids::text[])
              AND r.status IN ('queued', 'waiting') AND r.wake_at <= (SELECT now FROM clock)
                  AND NOT r.paused
            FOR UPDATE SKIP LOCKED
        ) r
    ), kept AS (
        -- The workspaces left with a due run this claim read and did not pick: they need
        -- no new next_wake_at (lease.py skips raising it). A workspace's picks are its
        -- first turns (picked cuts in order of turn), so it kept one unless its last
        -- candidate (turn n) was picked.
        SELECT workspace_id FROM candidates
        EXCEPT
        SELECT workspace_id FROM picked WHERE turn = n
    ), due AS (
        -- taken_over: the run's lease had lapsed (its executor died or stalled).
        SELECT workspace_id, run_id, taken_over, ($1::text[])[row_number() OVER ()] AS owner,
               workspace_id IN (SELECT workspace_id FROM kept) AS keeps_due
        FROM (SELECT *, true AS taken_over FROM lapsed
              UNION ALL SELECT *, false FROM fresh) d
    ), leased AS (
        UPDATE runs r SET
            status = 'running',
            wait_reason = NULL,
            release = coalesce(r.release, $7::text),
            log_version = greatest(r.log_version, coalesce(
                (SELECT writes FROM routing WHERE $7::text IS NOT NULL), 0)),
            lease_owner = due.owner,
            lease_epoch = r.lease_epoch + 1,
            attempt = r.attempt + (r.status = 'running')::int,
            wake_at = (SELECT now FROM clock) + make_interval(secs => $2),
            -- A new hold begins; a takeover first counts the lapsed hold up to its
            -- lease expiry (0006_run_limits.sql).
            active_seconds = r.active_seconds + CASE WHEN r.status = 'running'
                THEN run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock)) ELSE 0 END,
            held_since = (SELECT now FROM clock),
            started_at = coalesce(r.started_at, (SELECT now FROM clock)),
            updated_at = now()
        FROM due
        WHERE r.workspace_id = due.workspace_id AND r.run_id = due.run_id
          AND r.workspace_id = ANY(locked::text[])
        RETURNING r AS run, run_held_seconds(r.held_since, r.wake_at, (SELECT now FROM clock)) AS held_seconds,
            due.taken_over, due.keeps_due
    )
    SELECT array_agg(c.run), array_agg(c.held_seconds), array_agg(c.taken_over),
           array_agg(c.keeps_due),
           -- Served: got a fresh run, or had none these owners could take (at its caps,
           -- paused, tools the owners do not carry, another release): to the back of the
           -- line. One that lost out only to a full batch keeps its place.
           (SELECT array_agg(l.workspace_id) FROM unnest(locked::text[]) AS l(workspace_id)
            WHERE l.workspace_id IN (SELECT workspace_id FROM fresh)
               OR l.workspace_id NOT IN (SELECT workspace_id FROM candidates))
    INTO out_runs, out_held, out_taken, out_keeps, served_ids
    FROM leased c;
    -- The fresh runs (a run taken over was 'running' already) added to shard 0 of
    -- their workspace's count and of their agent's, here under the lock of step a
    -- (agentrun.claim_counts keeps the row trigger from counting them again). On
    -- Citus the trigger fires on the worker, which does not see the setting: the
    -- distribution step turns it off for this function, and the trigger counts.
    IF current_setting('agentrun.claim_counts', true) = 'on' THEN
        INSERT INTO workspace_running_counts AS c (workspace_id, shard, n)
        SELECT (out_runs[i]).workspace_id, 0, count(*)
        FROM generate_subscripts(out_runs, 1) i
        WHERE NOT out_taken[i]
        GROUP BY 1
        ORDER BY 1
        ON CONFLICT (workspace_id, shard) DO UPDATE SET n = c.n + excluded.n;
        INSERT INTO agent_running_counts AS c (workspace_id, agent_id, shard, n)
        SELECT (out_runs[i]).workspace_id, (out_runs[i]).agent_id, 0, count(*)
        FROM generate_subscripts(out_runs, 1) i
        WHERE NOT out_taken[i]
        GROUP BY 1, 2
        ORDER BY 1, 2
        ON CONFLICT (workspace_id, agent_id, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    -- metered: the workspace has a credit account (control_plane/credits/claims.py).
    IF out_runs IS NOT NULL THEN
        SELECT array_agg(a.workspace_id) INTO metered_ids FROM credit_accounts a
        WHERE a.workspace_id = ANY(locked);
    END IF;
    RETURN QUERY SELECT out_runs[i], out_held[i], out_taken[i], out_keeps[i],
                        coalesce((out_runs[i]).workspace_id = ANY(metered_ids), false),
                        (out_runs[i]).workspace_id, NULL::boolean, NULL::boolean
                 FROM generate_subscripts(out_runs, 1) i;
    -- Each locked workspace: whether it was served, and whether the claim may
    -- have emptied it (it got fewer runs than its room, at least one, and kept
    -- no due run it read: its next_wake_at is raised from its runs). A
    -- workspace at its cap or paused is raised too: to its first lease end if
    -- it has nothing due, so that it takes no turn until then.
    RETURN QUERY
        SELECT NULL::runs, NULL::double precision, NULL::boolean, NULL::boolean, NULL::boolean,
               t.workspace_id, t.workspace_id = ANY(coalesce(served_ids, '{}')),
               greatest(t.room, 1) > (SELECT count(*) FROM unnest(out_runs) g
                                      WHERE g.workspace_id = t.workspace_id)
               AND NOT EXISTS (SELECT 1 FROM generate_subscripts(out_runs, 1) i
                               WHERE (out_runs[i]).workspace_id = t.workspace_id AND out_keeps[i])
        FROM unnest(locked, rooms) AS t(workspace_id, room)
        UNION ALL
        SELECT NULL, NULL, NULL, NULL, NULL, g.workspace_id, true, true
        FROM unnest(gone) AS g(workspace_id);
END
$claim$;
$function$, '/* the agent''s due runs */',
        CASE WHEN current_setting('server_version_num')::int >= 180000
                  AND current_setting('agentrun.claim_walk', true) IS DISTINCT FROM 'levels'
             THEN skip_scan ELSE levels END);
END
$claim_walk$;

-- The shard a workspace's rows are on: 0 on plain PostgreSQL; on Citus the
-- distribution step (control_plane/store/citus.py) makes it the shard of
-- `runs` that holds the workspace, so the claim runs its lease step once per
-- shard.
CREATE FUNCTION agentrun_shard_of(ws text) RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT 0::bigint $$;

-- agentrun_claim(): the claim as run_claim calls it (section 7): the turns
-- taken here, the lease step on each shard holding one of them
-- (agentrun_claim_shard), the turns marked and the emptied ones raised here.
CREATE FUNCTION agentrun_claim(
    owners text[], lease_seconds double precision, at timestamptz, scope text[],
    carried jsonb, continued text[], own_release text, live_seconds double precision,
    gated boolean)
RETURNS TABLE (run runs, held_seconds double precision, taken_over boolean, keeps_due boolean,
               others_due boolean, metered boolean)
LANGUAGE plpgsql VOLATILE
AS $claim$
#variable_conflict use_column
DECLARE
    claim_clock timestamptz := coalesce($3, now());
    expected text[];
    taken text[] := '{}';
    turn_ids text[];
    turn_shards bigint[];
    shard_ids text[];
    left_owners text[] := $1;
    round_limit integer;
    rounds integer := 0;
    budget integer;
    ws_left integer;
    s record;
    shard_runs runs[];
    shard_held double precision[];
    shard_taken boolean[];
    shard_keeps boolean[];
    shard_metered boolean[];
    shard_served text[];
    shard_empty text[];
    out_runs runs[] := '{}';
    out_held double precision[] := '{}';
    out_taken boolean[] := '{}';
    out_keeps boolean[] := '{}';
    out_metered boolean[] := '{}';
    served_ids text[] := '{}';
    maybe_empty text[] := '{}';
    locked text[];
    raised_ids text[];
    raised_wakes timestamptz[];
    pending text[];
    wake_ids text[];
    wake_ats timestamptz[];
    folded text[];
BEGIN
    -- 0. Fold the due wakes lowered on the shards (workspace_wakes, under Citus;
    -- plain PostgreSQL lowers workspace_turns itself and has none): an unlocked
    -- read of every shard, then each turn row no other claimer holds lowered,
    -- and on each shard the rows folded deleted unless a writer holds or
    -- changed them (they are folded again by a later claim: a lower bound).
    SELECT array_agg(w.workspace_id), array_agg(w.wake_at) INTO wake_ids, wake_ats
    FROM workspace_wakes w WHERE w.wake_at <= claim_clock;
    IF wake_ids IS NOT NULL THEN
        INSERT INTO workspace_turns (workspace_id, next_wake_at)
        SELECT * FROM unnest(wake_ids, wake_ats) ON CONFLICT (workspace_id) DO NOTHING;
        SELECT array_agg(l.workspace_id) INTO folded FROM (
            SELECT t.workspace_id FROM workspace_turns t
            WHERE t.workspace_id = ANY(wake_ids)
            ORDER BY t.workspace_id
            FOR NO KEY UPDATE SKIP LOCKED
        ) l;
        UPDATE workspace_turns t SET next_wake_at = f.wake_at
        FROM unnest(wake_ids, wake_ats) AS f(workspace_id, wake_at)
        WHERE t.workspace_id = f.workspace_id AND t.workspace_id = ANY(folded)
          AND (t.next_wake_at IS NULL OR t.next_wake_at > f.wake_at);
        FOR s IN
            SELECT array_agg(f.workspace_id) AS ids, array_agg(f.wake_at) AS wakes
            FROM unnest(wake_ids, wake_ats) AS f(workspace_id, wake_at)
            WHERE f.workspace_id = ANY(folded)
            GROUP BY agentrun_shard_of(f.workspace_id)
        LOOP
            WITH held AS (
                SELECT w.workspace_id, w.wake_at FROM workspace_wakes w
                WHERE w.workspace_id = ANY(s.ids)
                FOR UPDATE SKIP LOCKED
            )
            DELETE FROM workspace_wakes w
            USING held h, unnest(s.ids, s.wakes) AS f(workspace_id, wake_at)
            WHERE w.workspace_id = ANY(s.ids) AND w.workspace_id = h.workspace_id
              AND h.workspace_id = f.workspace_id AND h.wake_at = f.wake_at;
        END LOOP;
    END IF;
    -- Step 1's turns, read without its lock (others_due, below).
    SELECT array_agg(t.workspace_id) INTO expected FROM (
        SELECT t.workspace_id FROM workspace_turns t
        WHERE t.next_wake_at <= claim_clock AND ($4 IS NULL OR t.workspace_id = ANY($4))
        ORDER BY t.last_served_at, t.workspace_id
        LIMIT cardinality($1)
    ) t;
    LOOP
        rounds := rounds + 1;
        round_limit := cardinality(left_owners);
        -- 1. Take turns: lock the workspaces whose turn it is, least recently
        -- served first, one per owner left.
        SELECT array_agg(t.workspace_id ORDER BY t.last_served_at, t.workspace_id),
               array_agg(agentrun_shard_of(t.workspace_id)
                         ORDER BY t.last_served_at, t.workspace_id)
        INTO turn_ids, turn_shards
        FROM (
            SELECT t.workspace_id, t.last_served_at FROM workspace_turns t
            WHERE t.next_wake_at <= claim_clock AND ($4 IS NULL OR t.workspace_id = ANY($4))
              AND t.workspace_id <> ALL(taken)
            ORDER BY t.last_served_at, t.workspace_id
            LIMIT round_limit
            FOR NO KEY UPDATE SKIP LOCKED
        ) t;
        EXIT WHEN turn_ids IS NULL;
        taken := taken || turn_ids;
        ws_left := cardinality(turn_ids);
        -- 2. The lease step on each shard holding a turn, in the order of its
        -- first turn, with a share of the owners left as large as its share of
        -- the turns left (one shard: all of them).
        FOR s IN
            SELECT u.shard, array_agg(u.workspace_id ORDER BY u.ord) AS ids
            FROM unnest(turn_ids, turn_shards) WITH ORDINALITY AS u(workspace_id, shard, ord)
            GROUP BY u.shard ORDER BY min(u.ord)
        LOOP
            EXIT WHEN coalesce(cardinality(left_owners), 0) = 0;
            budget := ceil(cardinality(left_owners) * cardinality(s.ids)::numeric / ws_left);
            ws_left := ws_left - cardinality(s.ids);
            SELECT coalesce(array_agg(c.run ORDER BY c.ord) FILTER (WHERE c.served IS NULL), '{}'),
                   array_agg(c.held_seconds ORDER BY c.ord) FILTER (WHERE c.served IS NULL),
                   array_agg(c.taken_over ORDER BY c.ord) FILTER (WHERE c.served IS NULL),
                   array_agg(c.keeps_due ORDER BY c.ord) FILTER (WHERE c.served IS NULL),
                   array_agg(c.metered ORDER BY c.ord) FILTER (WHERE c.served IS NULL),
                   array_agg(c.workspace_id) FILTER (WHERE c.served),
                   array_agg(c.workspace_id) FILTER (WHERE c.maybe_empty)
            INTO shard_runs, shard_held, shard_taken, shard_keeps, shard_metered, shard_served,
                 shard_empty
            FROM agentrun_claim_shard(left_owners[1:budget], $2, claim_clock, s.ids,
                                      $5, $6, $7, $8, $9)
                 WITH ORDINALITY AS c(run, held_seconds, taken_over, keeps_due, metered,
                                      workspace_id, served, maybe_empty, ord);
            out_runs := out_runs || shard_runs;
            out_held := out_held || shard_held;
            out_taken := out_taken || shard_taken;
            out_keeps := out_keeps || shard_keeps;
            out_metered := out_metered || shard_metered;
            served_ids := served_ids || shard_served;
            maybe_empty := maybe_empty || shard_empty;
            left_owners := left_owners[cardinality(shard_runs) + 1:];
        END LOOP;
        -- Another round while owners are left and this one's turns filled its
        -- limit: the workspaces whose turns it took gave fewer runs than owners
        -- (emptied, at their caps, paused, or with nothing these owners can run),
        -- and the next in line may have runs. At most four rounds.
        EXIT WHEN coalesce(cardinality(left_owners), 0) = 0 OR rounds >= 4
               OR cardinality(turn_ids) < round_limit;
    END LOOP;
    -- 3. Mark the served turns (to the back of the line).
    UPDATE workspace_turns t SET last_served_at = claim_clock
    WHERE t.workspace_id = ANY(served_ids);
    -- 4. Raise next_wake_at of the workspaces the claim may have emptied: lock
    -- those no admission or wake-up holds (KEY SHARE, workspace_lower_next_wake),
    -- then, a new statement, read their earliest wake: a queued or waiting run's
    -- (none while the queue is paused) or a lease's end (a lapsed lease is taken
    -- over at its workspace's turn). NULL: nothing.
    IF cardinality(maybe_empty) > 0 THEN
        SELECT array_agg(l.workspace_id) INTO locked FROM (
            SELECT t.workspace_id FROM workspace_turns t
            WHERE t.workspace_id = ANY(maybe_empty)
            ORDER BY t.workspace_id
            FOR UPDATE SKIP LOCKED
        ) l;
    END IF;
    IF locked IS NOT NULL THEN
        SELECT array_agg(w.workspace_id), array_agg(least(
                   CASE WHEN NOT w.queue_paused THEN (
                       SELECT min(first.wake_at)
                       FROM agents a
                       CROSS JOIN LATERAL (
                           SELECT r.wake_at FROM runs r
                           WHERE r.workspace_id = a.workspace_id AND r.agent_id = a.agent_id
                             AND r.status IN ('queued', 'waiting') AND r.wake_at IS NOT NULL
                           ORDER BY r.wake_at
                           LIMIT 1
                       ) first
                       WHERE a.workspace_id = w.workspace_id) END,
                   (SELECT r.wake_at FROM runs r
                    WHERE r.workspace_id = w.workspace_id AND r.status = 'running'
                    ORDER BY r.wake_at LIMIT 1)))
        INTO raised_ids, raised_wakes
        FROM workspaces w
        WHERE w.workspace_id = ANY(locked);
        UPDATE workspace_turns t SET next_wake_at = v.wake
        FROM (SELECT l.workspace_id, x.wake
              FROM unnest(locked) AS l(workspace_id)
              LEFT JOIN unnest(raised_ids, raised_wakes) AS x(workspace_id, wake)
                  USING (workspace_id)) v
        WHERE t.workspace_id = v.workspace_id;
    END IF;
    RETURN QUERY SELECT out_runs[i], out_held[i], out_taken[i], out_keeps[i], false, out_metered[i]
                 FROM generate_subscripts(out_runs, 1) i;
    -- others_due: a workspace of that read left unserved, still due, with room
    -- and its queue open: another claimer held it (0031).
    IF cardinality(out_runs) < cardinality($1) THEN
        SELECT array_agg(t.workspace_id) INTO pending FROM workspace_turns t
        WHERE t.workspace_id = ANY(expected)
          AND t.last_served_at IS DISTINCT FROM claim_clock
          AND t.next_wake_at <= claim_clock;
        IF pending IS NOT NULL AND EXISTS (
            SELECT 1 FROM workspaces w
            WHERE w.workspace_id = ANY(pending) AND NOT w.queue_paused
              AND (SELECT coalesce(sum(n), 0) FROM workspace_running_counts c
                   WHERE c.workspace_id = w.workspace_id) < w.max_concurrency
        ) THEN
            RETURN QUERY SELECT NULL::runs, NULL::double precision, NULL::boolean,
                                NULL::boolean, true, NULL::boolean;
        END IF;
    END IF;
END
$claim$;


-- ===========================================================================
-- 8. Approvals and the outbox
-- ===========================================================================

-- The approval a tool call waits on, with a hash of its exact arguments.
CREATE TABLE approvals (
    workspace_id      text NOT NULL,
    approval_id       uuid NOT NULL,
    run_id            uuid NOT NULL,
    decision_seq      integer NOT NULL,
    call_id           text NOT NULL,
    tool              text NOT NULL,
    arguments         jsonb NOT NULL,
    arguments_sha256  text NOT NULL
        CONSTRAINT approvals_arguments_sha256_check CHECK (arguments_sha256 ~ '^[0-9a-f]{64}$'),
    approvers         text[] NOT NULL,
    slack_approvers   text[] NOT NULL DEFAULT '{}',
    high_risk         boolean NOT NULL DEFAULT false,
    moves_money       boolean NOT NULL DEFAULT false,
    expire_at         timestamptz NOT NULL,
    expiry_seconds    integer NOT NULL CONSTRAINT approvals_expiry_seconds_check CHECK (expiry_seconds > 0),
    on_expiry         text NOT NULL
        CONSTRAINT approvals_on_expiry_check CHECK (on_expiry IN ('reject', 'escalate', 'remind')),
    escalate_to       text[] NOT NULL DEFAULT '{}',
    max_reminders     integer NOT NULL DEFAULT 2,
    escalation_level  integer NOT NULL DEFAULT 0,
    reminders_sent    integer NOT NULL DEFAULT 0,
    -- NULL while pending; set exactly once by a compare-and-set.
    decision          text CONSTRAINT approvals_decision_check
        CHECK (decision IN ('approved', 'rejected', 'edited', 'expired', 'closed')),
    decided_by        text,
    decided_at        timestamptz,
    reason            text,
    edited_arguments  jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- Where untrusted argument values first appeared (ArgumentOrigin objects; issue 48).
    argument_origins  jsonb NOT NULL DEFAULT '[]',
    PRIMARY KEY (workspace_id, approval_id),
    UNIQUE (workspace_id, run_id, call_id),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs,
    CONSTRAINT approval_decided_fully CHECK (
        (decision IS NULL) = (decided_at IS NULL) AND (decision IS NULL) = (decided_by IS NULL)),
    CONSTRAINT approval_edit_has_arguments CHECK (
        (decision = 'edited') = (edited_arguments IS NOT NULL)),
    -- Money never moves without a human: expiry may not approve it, and no
    -- policy can make it approve anything.
    CONSTRAINT approval_money_needs_a_human CHECK (
        NOT moves_money OR decision IS NULL OR decision <> 'approved' OR decided_by NOT LIKE 'system:%')
);

-- The expiry loop's index: pending approvals by expiry.
CREATE INDEX approvals_pending_expiry ON approvals (expire_at) WHERE decision IS NULL;
CREATE INDEX approvals_by_created ON approvals (workspace_id, created_at DESC, approval_id DESC);

-- An unknown outcome asks a person (issue 43): the park that waits for a person's decision
-- on a tool call whose outcome is unknown (wait_reason 'human') records its question here
-- and its notifications in the outbox, in the park's own transaction. Its policy is like an
-- approval's: every `every_seconds` (database clock, next_at) remind the people asked,
-- escalate to others, or fail the run; it closes when a person answers or the run ends.
-- The answer itself is the step ResolveUnknownOutcome appends (store/sql/unknowns.sql).
CREATE TABLE unknown_questions (
    workspace_id      text NOT NULL,
    run_id            uuid NOT NULL,
    seq               integer NOT NULL,  -- the unknown tool_result
    tool              text NOT NULL,
    recipients        text[] NOT NULL,   -- asked by mail
    slack_recipients  text[] NOT NULL DEFAULT '{}',  -- Slack users whose buttons answer
    every_seconds     integer NOT NULL CHECK (every_seconds > 0),
    on_timeout        text NOT NULL CHECK (on_timeout IN ('remind', 'escalate', 'fail')),
    escalate_to       text[] NOT NULL DEFAULT '{}',
    max_reminders     integer NOT NULL DEFAULT 2,
    -- The exact call (arguments, idempotency key, class) and what was tried.
    call              jsonb NOT NULL DEFAULT '{}',
    reminders_sent    integer NOT NULL DEFAULT 0,
    escalation_level  integer NOT NULL DEFAULT 0,
    next_at           timestamptz NOT NULL,
    closed_at         timestamptz,
    closed_reason     text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, run_id, seq),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs,
    CONSTRAINT unknown_question_closed_fully CHECK ((closed_at IS NULL) = (closed_reason IS NULL))
);

-- The policy loop's index: open questions by their next action.
CREATE INDEX unknown_questions_due ON unknown_questions (next_at) WHERE closed_at IS NULL;

-- A run that ends while it waits (cancelled, failed, past its max age) closes its pending
-- approvals and its open unknown-outcome questions in the same transaction: decision 'closed' by `system:run`, the reason naming
-- how the run ended, so they leave every inbox and metric at once and a later decision is
-- refused naming that (issue 43). Only runs that were waiting: a held run has none pending.
CREATE FUNCTION runs_close_approvals_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Closed when the run finished: its finished_at (the statement's clock, fixed or not).
    -- A closed approval that was posted to Slack gets its message edited to say so
    -- (an 'approval_closed' notification: the relay's chat.update of what it sent).
    WITH closed AS (
        UPDATE approvals SET decision = 'closed', decided_by = 'system:run',
                             decided_at = NEW.finished_at,
                             reason = 'run ' || NEW.status || coalesce(': ' || NEW.error, '')
        WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id AND decision IS NULL
        RETURNING workspace_id, approval_id, run_id, tool, reason, slack_approvers
    )
    INSERT INTO outbox (workspace_id, notification_id, kind, channel, recipient, payload)
    SELECT c.workspace_id, gen_random_uuid(), 'approval_closed', 'chat', '#approvals',
           jsonb_build_object('kind', 'approval_closed', 'approval_id', c.approval_id,
                              'run_id', c.run_id, 'tool', c.tool, 'reason', c.reason)
    FROM closed c WHERE cardinality(c.slack_approvers) > 0;
    UPDATE unknown_questions SET closed_at = NEW.finished_at,
                                 closed_reason = 'run ' || NEW.status || coalesce(': ' || NEW.error, '')
    WHERE workspace_id = NEW.workspace_id AND run_id = NEW.run_id AND closed_at IS NULL;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_close_approvals AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (OLD.status = 'waiting' AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_close_approvals_on_finish();

-- Capability links, single-use: only the SHA-256 of each token is stored.
CREATE TABLE approval_tokens (
    workspace_id  text NOT NULL,
    token_sha256  bytea NOT NULL,
    approval_id   uuid NOT NULL,
    approver      text NOT NULL,
    expires_at    timestamptz NOT NULL,
    used_at       timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, token_sha256),
    FOREIGN KEY (workspace_id, approval_id) REFERENCES approvals
);

-- Retention: an approval's tokens.
CREATE INDEX approval_tokens_by_approval ON approval_tokens (workspace_id, approval_id);

-- The transactional outbox: written in the same transaction as what it
-- announces, delivered afterwards by the relay (at least once, with a stable
-- notification id so that a redelivery is recognisable).
CREATE TABLE outbox (
    workspace_id     text NOT NULL,
    notification_id  uuid NOT NULL,
    kind             text NOT NULL,
    channel          text NOT NULL CONSTRAINT outbox_channel_check
        CHECK (channel IN ('mail', 'chat', 'webhook')),
    recipient        text NOT NULL,
    payload          jsonb NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- What the channel answered (Slack: the message's channel and ts, for a later chat.update).
    receipt          jsonb,
    PRIMARY KEY (workspace_id, notification_id)
);

CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE delivered_at IS NULL;

-- Where a workspace's notifications go (issue 43): Slack (the Web API's chat.postMessage /
-- chat.update with a bot token), e-mail over SMTP, and outgoing webhooks signed in the
-- Standard Webhooks format. Each channel's secret (the bot token, the SMTP password, the
-- webhook signing secret) is sealed with the workspace's data key (purpose 'channel').
-- The relay delivers a row through the workspace's channel of its kind (chat: slack, mail:
-- email); each notification also becomes one row per webhook channel (channel 'webhook',
-- recipient the channel id), in the same statement, so its `webhook-id` (the row's id) is
-- fixed before anything is sent.
CREATE TABLE channels (
    workspace_id   text NOT NULL REFERENCES workspaces,
    channel_id     uuid NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('slack', 'email', 'webhook')),
    name           text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    -- What is not secret: Slack's API base URL; the SMTP host, port, sender and TLS mode;
    -- the webhook's URL.
    config         jsonb NOT NULL,
    secret_sealed  bytea,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- A webhook subscribed to run lifecycle events (config.events): the newest finished_at
    -- it was given (control_plane/channels/lifecycle.py reads a window behind it).
    lifecycle_cursor timestamptz,
    PRIMARY KEY (workspace_id, channel_id),
    UNIQUE (workspace_id, name)
);

-- Alert rules (issue 43): a condition over the workspace's runs, evaluated by a loop on the
-- database clock, that fires once per breach through one of the workspace's channels.
-- failure_rate: at least min_finished runs (of agent_id, or all) finished in the last
-- window_seconds and at least `threshold` of them failed. stuck_on_person: a run has waited
-- on a person (an approval, a question, an unknown outcome) longer than waiting_seconds.
-- fired_at is set (and resolved_at cleared) by the one guarded update that fires, in the
-- transaction that queues the notification; resolved_at is set when the condition no longer
-- holds, so the next breach fires again and a breach that lasts fires once.
CREATE TABLE alert_rules (
    workspace_id     text NOT NULL REFERENCES workspaces,
    name             text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    channel_id       uuid NOT NULL,
    -- For slack and email channels: the Slack channel or the address to tell.
    recipient        text NOT NULL DEFAULT '',
    kind             text NOT NULL CHECK (kind IN ('failure_rate', 'stuck_on_person')),
    agent_id         text,
    window_seconds   integer NOT NULL DEFAULT 0 CHECK (window_seconds >= 0),
    min_finished     integer NOT NULL DEFAULT 0 CHECK (min_finished >= 0),
    threshold        double precision NOT NULL DEFAULT 0 CHECK (threshold BETWEEN 0 AND 1),
    waiting_seconds  integer NOT NULL DEFAULT 0 CHECK (waiting_seconds >= 0),
    fired_at         timestamptz,
    resolved_at      timestamptz,
    fire_count       integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, name),
    FOREIGN KEY (workspace_id, channel_id) REFERENCES channels ON DELETE CASCADE
);


-- ===========================================================================
-- 9. Triggers and schedules
-- ===========================================================================
--
-- A trigger (signed webhook, schedule, inbound mail, mail push source) turns
-- events into runs. Each event is recorded together with the run it starts,
-- in one statement, under a unique (workspace_id, trigger_id, dedupe_key): a
-- redelivered webhook, a second scheduler replica firing the same slot or a
-- refetched mail lands on the first event and its run. Events that filters
-- stop are recorded too, as filtered, with the reason and no run.

CREATE TABLE triggers (
    workspace_id          text NOT NULL REFERENCES workspaces,
    trigger_id            text NOT NULL
        CONSTRAINT triggers_trigger_id_check CHECK (trigger_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    agent_id              text NOT NULL,
    kind                  text NOT NULL,
    enabled               boolean NOT NULL DEFAULT true,
    -- How HTTP deliveries are signed; NULL for schedules (nobody calls them).
    scheme                text,
    -- Kind-specific settings: replay window, dedupe source, cron and time
    -- zone, interval, jitter, overlap policy, catch-up window, input text,
    -- mailbox URL, chain depth limit, debounce or batch.
    config                jsonb NOT NULL DEFAULT '{}',
    -- Cheap rules applied before a run exists (control_plane/triggers/filters.py).
    filters               jsonb NOT NULL DEFAULT '[]',
    -- Schedules: the next slot (as the schedule says) and when it fires (the
    -- slot plus the trigger's deterministic jitter).
    next_slot_at          timestamptz,
    next_fire_at          timestamptz,
    -- Push sources: the newest history id announced, the last one whose
    -- messages all committed, and when a fetch is due (while a fetcher holds
    -- it: its lease expiry, as runs.wake_at is).
    announced_history_id  bigint,
    last_history_id       bigint,
    fetch_due_at          timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- Schedules under the buffer_one policy: the one slot that came while the
    -- schedule's run was still going, and the dedupe key its event will have;
    -- the scheduler starts it once no run of the schedule is active.
    buffered_slot_at      timestamptz,
    buffered_dedupe_key   text,
    -- Why the trigger was last paused or unpaused (SetTriggerEnabled's note).
    note                  text,
    -- Push sources on a connection: why fetching is parked (the connection cannot be
    -- used), until a fetch works again.
    fetch_error           text,
    PRIMARY KEY (workspace_id, trigger_id),
    FOREIGN KEY (workspace_id, agent_id) REFERENCES agents,
    CONSTRAINT trigger_kind_known CHECK (kind IN ('webhook', 'schedule', 'mail', 'mail_push')),
    CONSTRAINT trigger_scheme_known CHECK (
        scheme IN ('hmac_sha256', 'stripe', 'slack', 'github', 'standard_webhooks')),
    CONSTRAINT trigger_http_is_signed CHECK ((kind = 'schedule') = (scheme IS NULL)),
    CONSTRAINT trigger_schedule_has_slot CHECK (
        (kind = 'schedule') = (next_slot_at IS NOT NULL AND next_fire_at IS NOT NULL)),
    CONSTRAINT trigger_fire_not_before_slot CHECK (next_fire_at >= next_slot_at),
    CONSTRAINT trigger_buffer_is_schedule CHECK (
        (buffered_slot_at IS NULL) = (buffered_dedupe_key IS NULL)
        AND (buffered_slot_at IS NULL OR kind = 'schedule'))
);

-- The scheduler's index: enabled schedules by fire time.
CREATE INDEX triggers_schedule_due ON triggers (next_fire_at)
    WHERE kind = 'schedule' AND enabled;
-- Push sources with a fetch queued (or held by a fetcher until its lease lapses).
CREATE INDEX triggers_fetch_due ON triggers (fetch_due_at)
    WHERE fetch_due_at IS NOT NULL;
-- Only schedules with a buffered slot: the pass that starts them costs
-- nothing for the others.
CREATE INDEX triggers_schedule_buffered ON triggers (buffered_slot_at)
    WHERE buffered_slot_at IS NOT NULL;

-- Signing secrets. Two may be active while a sender rotates; a rotated-out
-- secret keeps working until expires_at, then never again. Never returned by
-- any API after the response that created it. Sealed with the workspace's
-- data key (control_plane/crypto/envelope.py, purpose "trigger_secret"):
-- `secret` holds a plain value only on rows written before sealing existed,
-- until the control plane's startup backfill seals it and clears it.
CREATE TABLE trigger_secrets (
    workspace_id  text NOT NULL,
    trigger_id    text NOT NULL,
    secret_id     integer NOT NULL CONSTRAINT trigger_secrets_secret_id_check CHECK (secret_id > 0),
    secret        text CONSTRAINT trigger_secrets_secret_check CHECK (length(secret) BETWEEN 8 AND 512),
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz,
    sealed        bytea,
    PRIMARY KEY (workspace_id, trigger_id, secret_id),
    FOREIGN KEY (workspace_id, trigger_id) REFERENCES triggers,
    CONSTRAINT trigger_secret_one_form CHECK ((secret IS NULL) <> (sealed IS NULL))
);

-- What the sealing backfill still has to seal (empty once it ran).
CREATE INDEX trigger_secrets_plaintext ON trigger_secrets (workspace_id, trigger_id)
    WHERE secret IS NOT NULL;

-- An event of a trigger with a debounce or a batch (control_plane/triggers/
-- flow.py) is recorded once per dedupe key too, but `pending`: no run yet,
-- its flow key (the debounce key's value, or '' for the trigger's one batch)
-- and its place in arrival order (flow_seq, from trigger_flow_seq).
CREATE TABLE trigger_events (
    workspace_id   text NOT NULL,
    event_id       uuid NOT NULL,
    trigger_id     text NOT NULL,
    -- Whatever the source guarantees stable: the delivery id, the Message-ID,
    -- agent_id:scheduled_for.
    dedupe_key     text NOT NULL
        CONSTRAINT trigger_events_dedupe_key_check CHECK (length(dedupe_key) BETWEEN 1 AND 512),
    status         text NOT NULL,
    -- Why a filtered event started no run.
    reason         text,
    run_id         uuid,
    -- Schedules: the slot this event fires (before jitter).
    scheduled_for  timestamptz,
    -- Mail: how many agent hops the message has behind it (0 = a human's).
    chain_depth    integer NOT NULL DEFAULT 0
        CONSTRAINT trigger_events_chain_depth_check CHECK (chain_depth >= 0),
    -- The event as received (a webhook's parsed body, a mail message).
    payload        jsonb NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    flow_key       text,
    flow_seq       bigint,
    PRIMARY KEY (workspace_id, event_id),
    FOREIGN KEY (workspace_id, trigger_id) REFERENCES triggers,
    -- Checked at commit: trigger_event_admit inserts the event before its run, in one
    -- statement, which a Citus coordinator runs as several (0039).
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs DEFERRABLE INITIALLY DEFERRED,
    CONSTRAINT event_accepted_has_run CHECK ((status = 'accepted') = (run_id IS NOT NULL)),
    CONSTRAINT event_filtered_has_reason CHECK ((status = 'filtered') = (reason IS NOT NULL)),
    CONSTRAINT event_status_known CHECK (status IN ('accepted', 'filtered', 'pending')),
    CONSTRAINT event_pending_has_flow_key CHECK (
        status <> 'pending' OR (flow_key IS NOT NULL AND flow_seq IS NOT NULL))
);

-- The dedupe constraint: one event (and so at most one run) per stable key.
CREATE UNIQUE INDEX trigger_events_dedupe ON trigger_events (workspace_id, trigger_id, dedupe_key);
-- Which event started a run (the chain depth of mail our agents send).
CREATE INDEX trigger_events_by_run ON trigger_events (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX trigger_events_by_trigger
    ON trigger_events (workspace_id, trigger_id, received_at DESC, event_id DESC);
-- A flush takes a group's pending events in arrival order.
CREATE INDEX trigger_events_pending
    ON trigger_events (workspace_id, trigger_id, flow_key, flow_seq) WHERE status = 'pending';

CREATE SEQUENCE trigger_flow_seq;

-- When the pending events of one flow key are due: a debounce after its quiet
-- period (every event pushes it back), a batch when it is full or its oldest
-- event has waited max_seconds. The scheduler flushes a due group in one
-- transaction that admits the run and marks the events it holds accepted with
-- that run, so a crash at any point neither loses nor repeats one.
CREATE TABLE trigger_flow_groups (
    workspace_id  text NOT NULL,
    trigger_id    text NOT NULL,
    flow_key      text NOT NULL,
    mode          text NOT NULL CONSTRAINT trigger_flow_groups_mode_check CHECK (mode IN ('debounce', 'batch')),
    -- Pending events counted by arrivals (a flush sets it to those it left).
    pending       integer NOT NULL CONSTRAINT trigger_flow_groups_pending_check CHECK (pending >= 0),
    opened_at     timestamptz NOT NULL,
    due_at        timestamptz NOT NULL,
    PRIMARY KEY (workspace_id, trigger_id, flow_key),
    FOREIGN KEY (workspace_id, trigger_id) REFERENCES triggers
);

-- The scheduler's flush pass: groups by due time.
CREATE INDEX trigger_flow_groups_due ON trigger_flow_groups (due_at);


-- ===========================================================================
-- 10. Sessions
-- ===========================================================================
--
-- A session is a conversation with one agent; each turn is a run. The
-- session row is the lock that keeps two turns of one conversation from
-- running at once. What a message sent while the previous turn still runs
-- does is the session's strategy, overridable per message
-- (control_plane/api/sessions.py):
--   * reject     refused with ABORTED / HTTP 409 (the default);
--   * enqueue    the turn is admitted at once but parked (status 'waiting',
--                wait_reason 'session', no wake_at): the trigger below wakes
--                it when the turn before it ends, in the very transaction
--                that ends that turn's run, exactly once;
--   * interrupt  the running turn's run is cancelled (its executor is fenced
--                at its next commit) and the new turn starts with the
--                transcript so far, the interrupted turn's committed
--                decisions and tool results included;
--   * rollback   as interrupt, but the cancelled turn is left out of every
--                later transcript.
--
-- Why exactly once. A run reaches a terminal status once, and the trigger
-- fires on that one transition whatever statement makes it. It wakes only the
-- session's first unfinished turn, and only while that turn's run is still
-- parked. A send racing the end of a turn holds the session row and then
-- share locks on the runs of every unfinished turn (session_unfinished_lock):
-- the ending transaction holds its run's row until it commits, so either the
-- send sees that turn ended (and admits its own turn queued if none is left),
-- or the ending transaction's trigger sees the parked turn and wakes it.

CREATE TABLE sessions (
    workspace_id  text NOT NULL REFERENCES workspaces,
    session_id    uuid NOT NULL,
    agent_id      text NOT NULL,
    title         text NOT NULL DEFAULT '',
    turn_count    integer NOT NULL DEFAULT 0 CONSTRAINT sessions_turn_count_check CHECK (turn_count >= 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    strategy      text NOT NULL DEFAULT 'reject' CONSTRAINT session_strategy_known
        CHECK (strategy IN ('reject', 'enqueue', 'interrupt', 'rollback')),
    -- 'private': only its members (session_members) and the workspace's admins see it,
    -- its turns' runs and their events (migration 0051, docs/sessions.md).
    visibility    text NOT NULL DEFAULT 'workspace' CONSTRAINT session_visibility_known
        CHECK (visibility IN ('workspace', 'private')),
    PRIMARY KEY (workspace_id, session_id),
    FOREIGN KEY (workspace_id, agent_id) REFERENCES agents
);

CREATE INDEX sessions_by_updated ON sessions (workspace_id, updated_at DESC, session_id DESC);

-- ListSessions pages through a workspace's sessions newest first, by creation (a key
-- that does not move as sessions get turns, so a page never skips or repeats one).
CREATE INDEX sessions_by_created ON sessions (workspace_id, created_at DESC, session_id DESC);

-- The private sessions of a workspace, few or none: a reader's feed and run list first ask
-- whether there are any (one probe of this index per query) before looking per row.
CREATE INDEX sessions_private ON sessions (workspace_id, session_id) WHERE visibility = 'private';

-- One row per turn; the turn's run holds its input, status and answer.
CREATE TABLE session_turns (
    workspace_id  text NOT NULL,
    session_id    uuid NOT NULL,
    turn          integer NOT NULL CONSTRAINT session_turns_turn_check CHECK (turn > 0),
    run_id        uuid NOT NULL,
    -- Optional client-chosen key: a retried send returns the turn it created.
    request_id    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- Why the turn ended early: 'interrupt' (its committed steps stay in the
    -- transcript) or 'rollback' (the turn is left out of the transcript).
    ended_by      text CONSTRAINT session_turn_ended_by_known CHECK (ended_by IN ('interrupt', 'rollback')),
    PRIMARY KEY (workspace_id, session_id, turn),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions,
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs
);

CREATE UNIQUE INDEX session_turns_run ON session_turns (workspace_id, run_id);
CREATE UNIQUE INDEX session_turns_request_id ON session_turns (workspace_id, session_id, request_id)
    WHERE request_id IS NOT NULL;

-- The members of a private session: principals' labels (`key:NAME`, `person:NAME`), read
-- when a reader reads, so adding one shows them the session's past too (migration 0051).
CREATE TABLE session_members (
    workspace_id  text NOT NULL,
    session_id    uuid NOT NULL,
    member        text NOT NULL CONSTRAINT session_member_label
        CHECK (member ~ '^(key|person):.' AND length(member) <= 300),
    added_by      text,
    added_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, session_id, member),
    FOREIGN KEY (workspace_id, session_id) REFERENCES sessions ON DELETE CASCADE
);

-- The transcript a session's turn `before_turn` carries: each earlier turn (at
-- most the last 100, and whole turns dropped from the oldest to keep it within
-- 256 KiB) as its user message, then the answer of a completed turn, or the
-- committed decisions and tool results of an interrupted one. Rolled-back
-- turns are left out.
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

-- Wake the session's first unfinished turn, if it is parked waiting for the
-- turns before it (a run of the session, `rid`, just ended): its input step
-- (never read yet: the run was never claimed) gets the transcript as of now.
-- The first unfinished turn, not merely the next one: a parked turn cancelled
-- by CancelRun ends too, and must neither wake the turn after it while an
-- earlier one still runs nor leave that turn parked for ever.
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


-- ===========================================================================
-- 11. Connections
-- ===========================================================================

-- Connected accounts: a workspace's OAuth grants at the tool providers, their
-- tokens sealed by the workspace's data key (control_plane/crypto/envelope.py,
-- purpose "connection_token"), never in plain text.
--
-- status: active (usable; the access token may still need a refresh),
-- expired (the access token lapsed and no refresh token is held), revoked
-- (the provider or a user revoked the grant), needs_reauth (a refresh was
-- refused: the owner must connect again). token_generation counts stored
-- pairs: a refresh stores generation n+1 only if it still reads n, so two
-- writers can never interleave an old pair over a new one.
CREATE TABLE connections (
    workspace_id       text NOT NULL REFERENCES workspaces,
    connection_id      uuid NOT NULL,
    provider           text NOT NULL
        CONSTRAINT connections_provider_check CHECK (provider ~ '^[a-z][a-z0-9_-]{0,62}$'),
    account            text NOT NULL
        CONSTRAINT connections_account_check CHECK (length(account) BETWEEN 1 AND 320),
    -- The principal label (kind:name) that connected it: asked to reconnect when it breaks.
    owner              text NOT NULL
        CONSTRAINT connections_owner_check CHECK (length(owner) BETWEEN 1 AND 400),
    scopes             text[] NOT NULL DEFAULT '{}',
    status             text NOT NULL DEFAULT 'active' CONSTRAINT connections_status_check
        CHECK (status IN ('active', 'expired', 'revoked', 'needs_reauth')),
    access_sealed      bytea,
    refresh_sealed     bytea,
    access_expires_at  timestamptz,
    token_generation   bigint NOT NULL DEFAULT 1,
    -- Why the connection is not active (no token text ever: the provider's error code).
    status_reason      text NOT NULL DEFAULT '',
    -- When its owner was asked to reconnect (once per break; a reconnect clears it).
    notified_at        timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, connection_id),
    UNIQUE (workspace_id, provider, account),
    CONSTRAINT connection_active_has_token CHECK (status <> 'active' OR access_sealed IS NOT NULL)
);

-- An authorization in flight: the state parameter (stored only as its
-- SHA-256) and the PKCE verifier (sealed, bound to the flow's id), from the
-- start link to the callback.
CREATE TABLE connection_flows (
    state_sha256     bytea PRIMARY KEY
        CONSTRAINT connection_flows_state_sha256_check CHECK (length(state_sha256) = 32),
    workspace_id     text NOT NULL REFERENCES workspaces,
    flow_id          uuid NOT NULL,
    provider         text NOT NULL,
    owner            text NOT NULL,
    scopes           text[] NOT NULL,
    verifier_sealed  bytea NOT NULL,
    -- A reconnect link names the connection it repairs.
    connection_id    uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL
);

CREATE INDEX connection_flows_expiry ON connection_flows (expires_at);


-- ===========================================================================
-- 12. Credits
-- ===========================================================================
--
-- Every model call and tool call is priced at commit time
-- (control_plane/credits/pricing.py) and summed on the run in the commit's
-- own statement. A workspace with a credit account pays for its runs out of
-- reservations: a run reserves a chunk before its first step (at claim) and
-- tops up in chunks when its spend reaches what it reserved (at commit); each
-- reservation is keyed (run_id, chunk), and the chunk number comes from the
-- locked run row, so a retried claim or commit finds the reservation made and
-- never takes a second one. When the run ends, whatever path ends it, the
-- trigger below settles it in the same transaction: its spend moves to
-- `spent` and the unused rest returns to the balance. A workspace without an
-- account row is unlimited.
--
-- The identity the ledger keeps, at every commit (credits_balance): granted =
-- balance + reserved + spent, where `reserved` is what live runs hold
-- (including what they have spent so far) and `spent` is what ended runs
-- used. The balance may go below zero by at most the step that crossed the
-- line: a step already paid at the provider is always recorded.

CREATE TABLE credit_accounts (
    workspace_id     text PRIMARY KEY REFERENCES workspaces,
    granted_micros   bigint NOT NULL DEFAULT 0,
    balance_micros   bigint NOT NULL DEFAULT 0,
    reserved_micros  bigint NOT NULL DEFAULT 0
        CONSTRAINT credit_accounts_reserved_micros_check CHECK (reserved_micros >= 0),
    spent_micros     bigint NOT NULL DEFAULT 0
        CONSTRAINT credit_accounts_spent_micros_check CHECK (spent_micros >= 0),
    -- How much a run reserves at a time.
    chunk_micros     bigint NOT NULL DEFAULT 1000000
        CONSTRAINT credit_accounts_chunk_micros_check CHECK (chunk_micros > 0),
    -- What a run does when its reservation is spent and the balance is empty.
    out_of_credits   text NOT NULL DEFAULT 'park'
        CONSTRAINT credit_accounts_out_of_credits_check CHECK (out_of_credits IN ('park', 'fail')),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT credits_balance CHECK (granted_micros = balance_micros + reserved_micros + spent_micros)
);

-- Append-only. A grant moves granted and balance up; a reserve moves balance
-- to reserved; a run's end writes its spend (reserved to spent) and its
-- release (reserved back to balance; negative when the last step overdrew the
-- reservation).
CREATE TABLE credit_ledger (
    workspace_id   text NOT NULL REFERENCES credit_accounts,
    entry_id       bigint GENERATED ALWAYS AS IDENTITY,
    kind           text NOT NULL
        CONSTRAINT credit_ledger_kind_check CHECK (kind IN ('grant', 'reserve', 'spend', 'release')),
    run_id         uuid,
    chunk          integer NOT NULL DEFAULT 0,
    amount_micros  bigint NOT NULL,
    granted_by     text,
    note           text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, entry_id),
    CONSTRAINT ledger_run_entries CHECK ((kind = 'grant') = (run_id IS NULL)),
    CONSTRAINT ledger_grant_positive CHECK (kind <> 'grant' OR amount_micros > 0),
    CONSTRAINT ledger_reserve_positive CHECK (kind <> 'reserve' OR (amount_micros > 0 AND chunk > 0))
);

-- The key that makes a retried reservation (or settlement) a no-op.
CREATE UNIQUE INDEX credit_ledger_run_key ON credit_ledger (workspace_id, run_id, kind, chunk)
    WHERE run_id IS NOT NULL;

-- Settle a metered run when it ends, in the transaction that ends it. The
-- ledger rows are written first and the account moves only by what they
-- inserted, so a second settlement of the same run (it cannot end twice, but
-- the key says so) moves nothing.
CREATE FUNCTION runs_credits_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    settled integer;
BEGIN
    WITH entries AS (
        INSERT INTO credit_ledger (workspace_id, kind, run_id, chunk, amount_micros)
        VALUES (NEW.workspace_id, 'spend', NEW.run_id, 0, NEW.cost_micros),
               (NEW.workspace_id, 'release', NEW.run_id, 0,
                NEW.credits_reserved_micros - NEW.cost_micros)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO settled FROM entries;
    IF settled = 2 THEN
        UPDATE credit_accounts SET
            balance_micros = balance_micros + NEW.credits_reserved_micros - NEW.cost_micros,
            reserved_micros = reserved_micros - NEW.credits_reserved_micros,
            spent_micros = spent_micros + NEW.cost_micros,
            updated_at = now()
        WHERE workspace_id = NEW.workspace_id;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_credits_finish AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.credit_chunks > 0
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_credits_on_finish();


-- ===========================================================================
-- 13. Identity, access and keys
-- ===========================================================================
--
-- Credentials are API keys kept only as a SHA-256 of their 256-bit secret
-- (the key text is shown once), each of one kind: a workspace key (one
-- workspace, one role, a principal name), an executor credential (scoped to
-- the workspaces its pool may serve; NULL scope: all) or a platform admin key
-- (creates workspaces). People who sign in with OpenID Connect get their role
-- in a workspace from workspace_members. Every privileged write appends to
-- audit_log in the same transaction as the write itself.

CREATE TABLE api_keys (
    key_id         text PRIMARY KEY CONSTRAINT api_keys_key_id_check CHECK (key_id ~ '^[a-z0-9]{16}$'),
    kind           text NOT NULL,
    workspace_id   text REFERENCES workspaces,
    role           text,
    principal      text NOT NULL
        CONSTRAINT api_keys_principal_check CHECK (length(principal) BETWEEN 1 AND 200),
    scope          text[],
    secret_sha256  bytea NOT NULL
        CONSTRAINT api_keys_secret_sha256_check CHECK (length(secret_sha256) = 32),
    created_by     text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz,
    revoked_at     timestamptz,
    CONSTRAINT api_key_kind_known CHECK (kind IN ('workspace', 'executor', 'platform')),
    CONSTRAINT api_key_workspace_iff_workspace_kind CHECK (
        (kind = 'workspace') = (workspace_id IS NOT NULL)),
    CONSTRAINT api_key_role_iff_workspace_kind CHECK ((kind = 'workspace') = (role IS NOT NULL)),
    CONSTRAINT api_key_role_known CHECK (
        role IS NULL OR role IN ('admin', 'operator', 'reader', 'approver')),
    CONSTRAINT api_key_scope_only_for_executors CHECK (kind = 'executor' OR scope IS NULL),
    CONSTRAINT api_key_expires_after_creation CHECK (expires_at IS NULL OR expires_at > created_at)
);

CREATE INDEX api_keys_by_workspace ON api_keys (workspace_id, created_at, key_id)
    WHERE workspace_id IS NOT NULL;

-- People who sign in (OpenID Connect), by verified email, and their role.
CREATE TABLE workspace_members (
    workspace_id  text NOT NULL REFERENCES workspaces,
    person        text NOT NULL CONSTRAINT workspace_members_person_check
        CHECK (length(person) BETWEEN 3 AND 320 AND person LIKE '%@%'),
    role          text NOT NULL CONSTRAINT workspace_members_role_check
        CHECK (role IN ('admin', 'operator', 'reader', 'approver')),
    added_by      text NOT NULL,
    added_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, person)
);

-- Append-only: who did what to which object, when, under which request.
CREATE TABLE audit_log (
    workspace_id  text NOT NULL,
    audit_id      bigint GENERATED ALWAYS AS IDENTITY,
    at            timestamptz NOT NULL DEFAULT now(),
    actor         text NOT NULL,
    action        text NOT NULL,
    object_kind   text NOT NULL,
    object_id     text NOT NULL,
    request_id    text NOT NULL,
    detail        jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (workspace_id, audit_id)
);

-- Retention: the audit rows of an object.
CREATE INDEX audit_log_by_object ON audit_log (workspace_id, object_kind, object_id);

-- Web console sessions: a browser that signed in (OpenID Connect for people,
-- a pasted API key for operators) holds an opaque random token in an
-- HttpOnly, SameSite=Strict cookie; the database keeps only its SHA-256. The
-- row names the principal the console acts as, so every page reads through
-- the same access rules as gRPC; a key session also names its key, so
-- revoking the key ends it. Sessions end at expires_at or when signed out
-- (the row is deleted).
CREATE TABLE console_sessions (
    session_sha256  bytea PRIMARY KEY
        CONSTRAINT console_sessions_session_sha256_check CHECK (length(session_sha256) = 32),
    workspace_id    text NOT NULL REFERENCES workspaces,
    kind            text NOT NULL CONSTRAINT console_sessions_kind_check CHECK (kind IN ('key', 'person')),
    principal       text NOT NULL,
    role            text NOT NULL,
    -- The key's id (kind key) or the person's OIDC subject (kind person); never a secret.
    credential_id   text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    CONSTRAINT console_sessions_check CHECK (expires_at > created_at)
);

CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);

-- Envelope encryption: per-workspace data keys, stored only wrapped by the
-- KMS's key-encryption key (a key file outside the database, or a cloud KMS),
-- never the key itself. New seals use the workspace's newest unretired
-- version; retired versions still open what they sealed. Re-wrapping under a
-- new KMS key version rewrites `wrapped` and `kms_key_version` only: nothing
-- sealed is re-encrypted.
CREATE TABLE workspace_data_keys (
    workspace_id     text NOT NULL REFERENCES workspaces,
    version          integer NOT NULL CONSTRAINT workspace_data_keys_version_check CHECK (version > 0),
    kms_key_version  text NOT NULL CONSTRAINT workspace_data_keys_kms_key_version_check
        CHECK (length(kms_key_version) BETWEEN 1 AND 512),
    wrapped          bytea NOT NULL CONSTRAINT workspace_data_keys_wrapped_check
        CHECK (length(wrapped) BETWEEN 32 AND 8192),
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- Set when a newer version takes over new seals; the key still opens old ciphertexts.
    retired_at       timestamptz,
    PRIMARY KEY (workspace_id, version)
);

-- Re-wrapping finds the keys not yet under the KMS's current version.
CREATE INDEX workspace_data_keys_by_kms_version ON workspace_data_keys (kms_key_version);

-- Durable Streams (control_plane/store/streams.py, docs/streams.md): append-only logs a
-- workspace writes under /v1/workspaces/{workspace_id}/streams/{path}, served over the
-- Durable Streams protocol. A stream is one row, locked FOR UPDATE by each append, close
-- and delete; its offsets are the protocol's `RRRRRRRRRRRRRRRR_BBBBBBBBBBBBBBBB` (zero-
-- padded, so text order is log order) and `tail_offset` is the one after its last message.
CREATE TABLE streams (
    workspace_id     text NOT NULL REFERENCES workspaces,
    stream_id        bigint GENERATED ALWAYS AS IDENTITY,
    path             text NOT NULL,
    content_type     text,
    ttl_seconds      bigint CONSTRAINT streams_ttl_check CHECK (ttl_seconds >= 0),
    -- Stream-Expires-At as the creator wrote it (echoed back), and as a time.
    expires_at_text  text,
    expires_at       timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    accessed_at      timestamptz NOT NULL DEFAULT now(),
    tail_offset      text NOT NULL DEFAULT '0000000000000000_0000000000000000',
    closed           boolean NOT NULL DEFAULT false,
    -- The producer append that closed it: its retry is a duplicate, not a conflict.
    closed_by        jsonb,
    -- The last Stream-Seq a writer coordinated with (compared as text, as the protocol says).
    last_seq         text,
    -- A fork reads its source up to fork_offset, then its own messages.
    forked_from      bigint,
    fork_offset      text,
    fork_sub_offset  integer,
    -- Forks alive on this stream: deleting it while any is only hides it (soft_deleted).
    ref_count        integer NOT NULL DEFAULT 0,
    soft_deleted     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (workspace_id, stream_id),
    CONSTRAINT streams_path_unique UNIQUE (workspace_id, path),
    FOREIGN KEY (workspace_id, forked_from) REFERENCES streams
);

-- One row per append; end_offset is the stream's offset after it (the protocol's
-- message offset). JSON streams keep each append's values as `v1,v2,` (compact).
CREATE TABLE stream_messages (
    workspace_id  text NOT NULL,
    stream_id     bigint NOT NULL,
    end_offset    text NOT NULL,
    data          bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, stream_id, end_offset),
    FOREIGN KEY (workspace_id, stream_id) REFERENCES streams ON DELETE CASCADE
);

-- Idempotent producers: the highest (epoch, seq) accepted from each producer id.
CREATE TABLE stream_producers (
    workspace_id  text NOT NULL,
    stream_id     bigint NOT NULL,
    producer_id   text NOT NULL,
    epoch         bigint NOT NULL,
    last_seq      bigint NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, stream_id, producer_id),
    FOREIGN KEY (workspace_id, stream_id) REFERENCES streams ON DELETE CASCADE
);

-- The workspace feed (the read-only stream `_agentrun/feed`): what happened in the
-- workspace, in commit order, so that a reader keeping a cursor catches up exactly once.
-- Triggers write one row per event in the transaction that makes it: a run created or
-- changing state (status or wait_reason: `waiting` for `human` is an unknown outcome
-- waiting for a person), an approval requested or decided, a session created. A reader
-- takes rows of finished transactions only (xid below the snapshot's xmin), ordered by
-- (xid, event_id): a row committed later always sorts after every row already served.
CREATE TABLE workspace_events (
    workspace_id  text NOT NULL,
    event_id      bigint GENERATED ALWAYS AS IDENTITY,
    xid           xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at            timestamptz NOT NULL DEFAULT now(),
    kind          text NOT NULL,
    object_id     text NOT NULL,
    detail        jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (workspace_id, event_id)
);

CREATE INDEX workspace_events_in_order ON workspace_events (workspace_id, xid, event_id);

-- The xid is taken where the row is stored: on a Citus coordinator an INSERT evaluates the
-- column default there, a transaction id from another counter than the shard's snapshot a
-- reader compares it with; this trigger fires on the node holding the row (the same value
-- on one PostgreSQL).
CREATE FUNCTION workspace_events_local_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.xid := pg_current_xact_id();
    RETURN NEW;
END $$;

CREATE TRIGGER workspace_events_local_xid BEFORE INSERT ON workspace_events
    FOR EACH ROW EXECUTE FUNCTION workspace_events_local_xid();

-- The transition table is read by a local query into arrays, then inserted from
-- unnest(): on a Citus worker a distributed INSERT ... SELECT cannot see `inserted`.
CREATE FUNCTION workspace_events_runs_created() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ws text[];
    ids text[];
    details jsonb[];
BEGIN
    -- Read the transition table locally (Citus cannot hand it to a distributed insert).
    SELECT array_agg(workspace_id), array_agg(run_id::text),
           array_agg(jsonb_build_object('agent_id', agent_id, 'status', status))
      INTO ws, ids, details
      FROM inserted;
    INSERT INTO workspace_events (workspace_id, kind, object_id, detail)
    SELECT w, 'run.created', o, d FROM unnest(ws, ids, details) AS t(w, o, d);
    RETURN NULL;
END $$;

CREATE TRIGGER runs_feed_insert AFTER INSERT ON runs REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION workspace_events_runs_created();

CREATE FUNCTION workspace_events_run_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workspace_events (workspace_id, kind, object_id, detail)
    VALUES (NEW.workspace_id, 'run.state', NEW.run_id::text,
            jsonb_build_object('agent_id', NEW.agent_id, 'status', NEW.status,
                               'wait_reason', NEW.wait_reason));
    RETURN NULL;
END $$;

CREATE TRIGGER runs_feed_state AFTER UPDATE OF status, wait_reason ON runs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.wait_reason IS DISTINCT FROM NEW.wait_reason)
    EXECUTE FUNCTION workspace_events_run_state();

CREATE FUNCTION workspace_events_approval() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workspace_events (workspace_id, kind, object_id, detail)
    VALUES (NEW.workspace_id,
            CASE WHEN TG_OP = 'INSERT' THEN 'approval.requested' ELSE 'approval.decided' END,
            NEW.approval_id::text,
            jsonb_build_object('run_id', NEW.run_id, 'tool', NEW.tool,
                               'decision', NEW.decision, 'decided_by', NEW.decided_by));
    RETURN NULL;
END $$;

CREATE TRIGGER approvals_feed_insert AFTER INSERT ON approvals FOR EACH ROW
    EXECUTE FUNCTION workspace_events_approval();

CREATE TRIGGER approvals_feed_decided AFTER UPDATE OF decision ON approvals FOR EACH ROW
    WHEN (OLD.decision IS NULL AND NEW.decision IS NOT NULL)
    EXECUTE FUNCTION workspace_events_approval();

CREATE FUNCTION workspace_events_session() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workspace_events (workspace_id, kind, object_id, detail)
    VALUES (NEW.workspace_id, 'session.created', NEW.session_id::text,
            jsonb_build_object('agent_id', NEW.agent_id, 'title', NEW.title));
    RETURN NULL;
END $$;

CREATE TRIGGER sessions_feed_insert AFTER INSERT ON sessions FOR EACH ROW
    EXECUTE FUNCTION workspace_events_session();

-- Model output while it is generated (the deltas an executor streams for the decision
-- step `seq` of a run it holds at `epoch`; `idx` counts them from 0 per model call), kept
-- so that a reader of the run's stream joining mid-call from offset 0 receives what every
-- other reader received. The committed decision stays the record: once step `seq` is
-- committed, its deltas are no longer served (the stream is compacted to the decision),
-- and they are deleted when the run's next call streams. A delta lands only while its
-- epoch holds the run (a fenced holder's are refused) and at most once (its key).
CREATE TABLE run_deltas (
    workspace_id  text NOT NULL,
    run_id        uuid NOT NULL,
    seq           integer NOT NULL,
    epoch         bigint NOT NULL,
    idx           integer NOT NULL,
    text          text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, run_id, seq, epoch, idx),
    FOREIGN KEY (workspace_id, run_id) REFERENCES runs ON DELETE CASCADE
);

-- Events by matching (issue 45; migrations/0049_events.sql says how matching and exactly-once work).
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

-- Concurrency keys (issue 45, item 3). An agent version's concurrency_key caps how many of
-- its runs with one key (the value at a path in the run's input) hold a slot at once, with
-- an optional rate of grants (a trigger may declare its own rule for the runs it starts:
-- runs.key_rule, read instead of the version's). runs_key_compute sets a run's key at
-- admission, with no side effect; runs_key_admit takes a slot (an upsert while held <
-- limit) or parks the run (status 'waiting', wait_reason 'concurrency_key', no wake_at:
-- the claim never takes it);
-- runs_key_release, on a slot holder's end by any path, passes the slot to the key's next
-- waiter (made queued and due) or frees it, in the ending transaction. A run holds its slot
-- from the grant until it ends. A key's row goes once it holds nothing and owes no wait.
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

CREATE TRIGGER runs_key_compute BEFORE INSERT ON runs FOR EACH ROW
    EXECUTE FUNCTION runs_key_compute();

CREATE FUNCTION runs_key_admit() RETURNS trigger
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
