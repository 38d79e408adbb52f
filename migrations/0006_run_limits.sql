-- Run limits that mean what they say, and a step counter that counts the log (issue 10).
--
-- The deadline (deadline_seconds) is a loop guard for a run that is working.
-- It used to be a wall-clock instant (deadline_at = admission + deadline),
-- so a run that waited two hours for a person's approval, or slept until
-- Thursday, failed with "deadline exceeded" when it woke. It now counts
-- ACTIVE time: the time executors hold the run.
--
--   active_seconds  the time of the run's holds that ended;
--   held_since      when the current hold began (set by the claim); NULL
--                   unless the run is 'running' (a CHECK keeps them together).
--
-- A hold ends when the run leaves 'running' (a commit that parks or
-- finishes it, a cancel, a failure, a hand-back; the trigger below) or when
-- another executor takes it over after its lease lapsed (the claim, on its
-- clock: lease.sql run_claim_due). Either adds the hold's time, from
-- held_since to the earlier of now and the lease expiry (wake_at, while
-- running): a lapsed holder is counted up to its lease expiry, the last
-- moment it could have been working, and the time between the lapse and the
-- takeover counts for nobody. While held, the active time
-- so far is active_seconds + run_held_seconds(held_since, wake_at, now); the
-- heartbeat refuses to renew a lease once that reaches deadline_seconds.
--
-- Max age (max_age_seconds; 0 = none) bounds the run as a whole, parked or
-- not: the run fails at expires_at (admission + max age). The heartbeat
-- refuses a held run past it; a sweep fails runs past it that nobody holds
-- (queued, parked, or with a lapsed lease), so a run parked on an event
-- that never comes does not wait forever. Both limits are copied from the
-- agent version at admission, like the others.

ALTER TABLE runs
    ADD COLUMN active_seconds double precision NOT NULL DEFAULT 0
        CONSTRAINT run_active_not_negative CHECK (active_seconds >= 0),
    ADD COLUMN held_since timestamptz,
    ADD COLUMN max_age_seconds integer NOT NULL DEFAULT 0
        CONSTRAINT run_max_age_not_negative CHECK (max_age_seconds >= 0),
    ADD COLUMN expires_at timestamptz;

-- Runs held while this migrates start their hold now; earlier time is not known.
UPDATE runs SET held_since = now() WHERE status = 'running';

ALTER TABLE runs
    DROP COLUMN deadline_at,
    ADD CONSTRAINT run_held_while_running CHECK ((status = 'running') = (held_since IS NOT NULL)),
    ADD CONSTRAINT run_expires_with_max_age CHECK ((max_age_seconds > 0) = (expires_at IS NOT NULL));

-- Runs that may outlive their max age, by when (the sweep reads it).
CREATE INDEX runs_expiring ON runs (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('queued', 'running', 'waiting');

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

CREATE TRIGGER runs_active_time BEFORE UPDATE ON runs FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION runs_count_active_time();

-- The step counter counts what the log holds, whoever writes the steps (the
-- admission's input, commits, approval holds and decisions, decisions on
-- unknown outcomes, cancels, limit failures): one place, once per statement.
CREATE FUNCTION steps_count_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs r SET step_count = r.step_count + n.added
    FROM (SELECT workspace_id, run_id, count(*)::integer AS added FROM inserted
          GROUP BY workspace_id, run_id ORDER BY workspace_id, run_id) n
    WHERE r.workspace_id = n.workspace_id AND r.run_id = n.run_id;
    RETURN NULL;
END $$;

CREATE TRIGGER steps_count AFTER INSERT ON steps REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION steps_count_on_insert();

UPDATE runs r SET step_count = (
    SELECT count(*) FROM steps s WHERE s.workspace_id = r.workspace_id AND s.run_id = r.run_id);
