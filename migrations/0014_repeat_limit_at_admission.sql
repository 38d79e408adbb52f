-- repeat_limit is copied at admission like every other limit (store/admission.py, with
-- the server default in RunDefaults), now that every run is admitted through the one
-- run_admit shape. The BEFORE INSERT trigger of 0008 read the agent version again on
-- every run insert and kept the default in SQL; it goes.

DROP TRIGGER runs_repeat_limit ON runs;
DROP FUNCTION runs_copy_repeat_limit();
