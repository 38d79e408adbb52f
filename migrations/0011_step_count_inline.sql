-- The step counter, counted by the statements that write steps instead of a
-- trigger. The statement-level trigger of 0006 re-updated the run row after
-- every commit (a second row version and a transition table on the hottest
-- path: it nearly doubled store.commit's cost). Every named query that inserts
-- into steps now bumps runs.step_count in the same statement, and
-- tests/unit/test_queries.py fails on one that does not.

DROP TRIGGER steps_count ON steps;
DROP FUNCTION steps_count_on_insert();

-- Recount once, in case a statement ran between the two versions.
UPDATE runs r SET step_count = (
    SELECT count(*) FROM steps s WHERE s.workspace_id = r.workspace_id AND s.run_id = r.run_id);
