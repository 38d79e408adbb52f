-- Every run of a session, turns and their whole descent (children, grandchildren, forks),
-- names the session (issue 42 item 4): set at admission (a turn's own, a child's from its
-- parent, a fork's from its source), so who may see a run of a private session is one
-- indexed predicate on the run's own row instead of a walk up its parents (the walk
-- stopped one level down: a grandchild of a private turn leaked, and so did a fork of
-- one). NULL: the run belongs to no session.
ALTER TABLE runs ADD COLUMN session_id uuid;

-- The runs already there: the turns, then their descendants and forks, level by level.
UPDATE runs r SET session_id = t.session_id
FROM session_turns t
WHERE t.workspace_id = r.workspace_id AND t.run_id = r.run_id;

DO $$
BEGIN
    LOOP
        UPDATE runs c SET session_id = p.session_id
        FROM runs p
        WHERE p.workspace_id = c.workspace_id AND p.session_id IS NOT NULL
          AND c.session_id IS NULL
          AND p.run_id IN (c.parent_run_id, c.forked_from_run_id);
        EXIT WHEN NOT FOUND;
    END LOOP;
END $$;

CREATE INDEX runs_of_session ON runs (workspace_id, session_id) WHERE session_id IS NOT NULL;
