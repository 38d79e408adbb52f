-- Private sessions (issue 42, build item 4): a session may be private to its members, and
-- then it, its turns' runs and their events are invisible to every other reader of the
-- workspace (GetSession, ListSessions, GetRun, ListRuns, the run, session and feed
-- streams), while its workspace's admins still see everything (docs/sessions.md).
-- Membership is read when a reader reads, not copied into the events: adding a member
-- shows them the session's past as well. A member is a principal's label as the log
-- records it (`key:NAME`, `person:NAME`).
ALTER TABLE sessions ADD COLUMN visibility text NOT NULL DEFAULT 'workspace'
    CONSTRAINT session_visibility_known CHECK (visibility IN ('workspace', 'private'));

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

-- The private sessions of a workspace, few or none: a reader's feed and run list first ask
-- whether there are any (one probe of this index per query) before looking per row.
CREATE INDEX sessions_private ON sessions (workspace_id, session_id) WHERE visibility = 'private';
