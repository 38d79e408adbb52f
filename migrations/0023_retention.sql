-- Retention (issue 17 item 5): a workspace keeps its finished runs (completed, failed,
-- cancelled) for retention_days after they finished, then the retention loop
-- (control_plane/retention.py) deletes them with their steps, payloads, trigger events,
-- approvals, session turns, signals and audit rows, a bounded batch of runs per statement.
-- 0 keeps everything forever (the default, so nothing existing changes).
--
-- The indexes let each batch find its rows without scanning a table: old finished runs by
-- workspace and finish time, and the rows that name a run without a key leading with it.
ALTER TABLE workspaces ADD COLUMN retention_days integer NOT NULL DEFAULT 0
    CONSTRAINT workspace_retention_days_range CHECK (retention_days BETWEEN 0 AND 36500);

CREATE INDEX runs_finished ON runs (workspace_id, finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX audit_log_by_object ON audit_log (workspace_id, object_kind, object_id);
CREATE INDEX payloads_by_run ON payloads (workspace_id, run_id);
CREATE INDEX approval_tokens_by_approval ON approval_tokens (workspace_id, approval_id);

-- The tool_result steps that reference a payload (`"payload": {"sha256": …}`), by sha256: a
-- payload is content-addressed, so a run that uploaded the same bytes second, or a fork
-- (its copied steps), references the payload of another run. Retention hands such a
-- payload over to a run that still references it rather than delete it under that run.
CREATE INDEX steps_payload_refs ON steps (workspace_id, ((payload -> 'payload' ->> 'sha256')))
    WHERE kind = 'tool_result' AND payload ? 'payload';
