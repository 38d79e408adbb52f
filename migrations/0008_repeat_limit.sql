-- Repetition guard (issue 12): the run's repeat_limit, copied from its agent version.
--
-- The Nth call of the same tool with the same arguments in one run is not
-- started: the executor parks the run (wait_reason 'repeat') until a person
-- lets it run, refuses it or stops the run. N is the agent version's
-- limits.repeat_limit (0 there = the server default, 3), copied onto the run
-- at admission like the other limits, so a later version never changes a
-- running run.
--
-- Runs are admitted by three statements (StartRun, trigger events, session
-- turns). Rather than threading one more parameter through each, the copy is
-- made here, once, for every insert that leaves repeat_limit NULL: the agent
-- version is immutable, so reading it at the insert is the same copy. An
-- admission that names repeat_limit explicitly keeps its value.

ALTER TABLE runs ADD COLUMN repeat_limit integer
    CONSTRAINT run_repeat_limit_positive CHECK (repeat_limit > 0);

-- Runs admitted before this migration get the server default.
UPDATE runs SET repeat_limit = 3;

CREATE FUNCTION runs_copy_repeat_limit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.repeat_limit IS NULL THEN
        SELECT coalesce(nullif((v.spec -> 'limits' ->> 'repeat_limit')::integer, 0), 3)
        INTO NEW.repeat_limit
        FROM agent_versions v
        WHERE v.workspace_id = NEW.workspace_id AND v.agent_id = NEW.agent_id
          AND v.version = NEW.agent_version;
        NEW.repeat_limit := coalesce(NEW.repeat_limit, 3);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER runs_repeat_limit BEFORE INSERT ON runs FOR EACH ROW
    EXECUTE FUNCTION runs_copy_repeat_limit();

ALTER TABLE runs ALTER COLUMN repeat_limit SET NOT NULL;
