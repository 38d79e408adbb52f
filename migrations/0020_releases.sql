-- Releases (issue 15): runs finish on the release they started on.
--
-- A run records the release of the executor that first claimed it (set by the
-- claim, sql/lease.sql) and is claimed afterwards only by executors of that
-- release, or of a release that declares it continues it (Hello.continues).
-- New runs (release NULL) go to the newest release with executors connected:
-- the latest promoted one, else the one first seen last (first_seen_at). A
-- draining release takes no new runs. Moving a run to another release is an
-- operator's explicit act (ReleaseService.MoveRunRelease), audited.

ALTER TABLE runs ADD COLUMN release text;

CREATE TABLE releases (
    release        text PRIMARY KEY CHECK (release <> ''),
    -- When an executor of this release first connected: the default order of "newest".
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    -- An operator's explicit promote: a promoted release is newer than any first seen.
    promoted_at    timestamptz,
    -- A drain (ReleaseService.DrainRelease): its executors claim nothing new and
    -- finish what they hold until drain_deadline, then hand back at a step boundary.
    draining_since timestamptz,
    drain_deadline timestamptz,
    -- When a canary pinned to this release last passed. With AGENTRUN_RELEASE_GATE=canary
    -- a release takes new runs only once promoted or past a canary.
    canary_passed_at timestamptz
);

-- A release's drain progress (ListReleases): the runs of a release that are not
-- finished, by status (held ones by when their hold began). The claim needs no
-- index of its own: its release filter rides on runs_due / runs_leases, and
-- passes over only runs left on a release with no executor (rare, and visible
-- until an operator moves them).
CREATE INDEX runs_by_release ON runs (release, status, held_since)
    WHERE release IS NOT NULL AND status IN ('queued', 'running', 'waiting');

CREATE INDEX executor_tools_by_release ON executor_tools (release, last_seen);

