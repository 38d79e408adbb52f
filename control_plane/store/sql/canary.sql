-- The contract canary's outcomes on a release, and its self-check (0038_release_self_check.sql).

-- name: release_canary_check_take :one
-- Take release $1's self-check canary for $2 seconds, for the connect of executor
-- $3, if no replica holds it (canary_check_until NULL or past) and the release
-- needs one: it never passed a canary, or its last canary failed after its last
-- pass. A failing release is checked again only for an executor other than the
-- one whose connect checked it last, so a broken executor that reconnects in a
-- loop does not run a canary each time. Database clock unless $4 (a subquery: Citus
-- refuses now() inside coalesce in a write to a reference table). `taken`, and
-- when not: the seconds another replica still holds it (NULL: not held).
WITH taken AS (
    UPDATE releases SET canary_check_until = (SELECT coalesce($4::timestamptz, now()) + make_interval(secs => $2)),
                        canary_check_by = $3
    WHERE release = $1
      AND (canary_check_until IS NULL OR canary_check_until <= (SELECT coalesce($4::timestamptz, now())))
      AND (canary_passed_at IS NULL OR canary_failed_at >= canary_passed_at)
      AND (canary_failed_at IS NULL OR canary_failed_at < canary_passed_at
           OR canary_check_by IS DISTINCT FROM $3)
    RETURNING release
)
SELECT EXISTS (SELECT 1 FROM taken) AS taken,
       (SELECT extract(epoch FROM canary_check_until - coalesce($4::timestamptz, now()))::float8
        FROM releases
        WHERE release = $1 AND canary_check_until > coalesce($4::timestamptz, now())) AS held_for;

-- name: release_canary_check_done :exec
-- The self-check of release $1 started by executor $2's connect is over: the next may run.
UPDATE releases SET canary_check_until = NULL WHERE release = $1 AND canary_check_by = $2;

-- name: release_canary_failed :exec
-- A canary on release $1 failed: now, with the failing stage and why ($2, "stage: reason").
UPDATE releases SET canary_failed_at = now(), canary_failure = $2 WHERE release = $1;
