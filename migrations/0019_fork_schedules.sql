-- Forks and schedule policies (issue 17, items 1 and 2).
--
-- Forks: RunService.ForkRun admits a new run whose log is a copy of another run's log up to
-- a chosen step, then continues live (control_plane/forks.py). The fork names where it came
-- from; the source lists its forks through ListRuns(forked_from_run_id), served by the index
-- below. No foreign key: a source may be deleted by retention while its forks live on, as a
-- child's parent may. The copied steps and the fork's 'forked' marker step are written at
-- admission, under epoch 0 like the input step, in the admission's own statement.
ALTER TABLE runs ADD COLUMN forked_from_run_id uuid, ADD COLUMN forked_from_seq integer,
    ADD CONSTRAINT run_fork_origin_whole CHECK (
        (forked_from_run_id IS NULL) = (forked_from_seq IS NULL)
        AND (forked_from_seq IS NULL OR forked_from_seq >= 0));
CREATE INDEX runs_forks_of ON runs (workspace_id, forked_from_run_id, created_at DESC, run_id DESC)
    WHERE forked_from_run_id IS NOT NULL;

-- The marker step kind, added to whatever kinds the constraint lists by now (other
-- migrations add kinds too: this one rebuilds the list it finds instead of restating it).
DO $$
DECLARE
    name text;
    def text;
BEGIN
    SELECT conname, pg_get_constraintdef(oid) INTO name, def FROM pg_constraint
    WHERE conrelid = 'steps'::regclass AND contype = 'c'
      AND pg_get_constraintdef(oid) LIKE '%kind = ANY (ARRAY[%';
    IF name IS NULL THEN
        RAISE EXCEPTION 'no CHECK constraint lists the step kinds: add ''forked'' by hand';
    END IF;
    IF position('''forked''' IN def) = 0 THEN
        EXECUTE format('ALTER TABLE steps DROP CONSTRAINT %I', name);
        EXECUTE format('ALTER TABLE steps ADD CONSTRAINT %I %s NOT VALID', name,
                       replace(def, 'ARRAY[', 'ARRAY[''forked''::text, '));
        EXECUTE format('ALTER TABLE steps VALIDATE CONSTRAINT %I', name);
    END IF;
END $$;

-- Schedules: the overlap policy, the catch-up window, the jitter and the input live in the
-- trigger's config (control_plane/triggers/schedule.py). These columns are state:
-- * buffered_slot_at, buffered_dedupe_key: under the buffer_one policy, the one slot that
--   came while the schedule's run was still going, and the dedupe key its event will have;
--   the scheduler starts it once no run of the schedule is active (control_plane/scheduler.py).
--   Only schedules with a buffered slot are in the index that pass reads, so the pass costs
--   nothing for the others.
-- * note: why the trigger was last paused or unpaused (SetTriggerEnabled's note).
ALTER TABLE triggers ADD COLUMN buffered_slot_at timestamptz, ADD COLUMN buffered_dedupe_key text,
    ADD COLUMN note text,
    ADD CONSTRAINT trigger_buffer_is_schedule CHECK (
        (buffered_slot_at IS NULL) = (buffered_dedupe_key IS NULL)
        AND (buffered_slot_at IS NULL OR kind = 'schedule'));
CREATE INDEX triggers_schedule_buffered ON triggers (buffered_slot_at)
    WHERE buffered_slot_at IS NOT NULL;
