-- A claim says when a workspace whose turn it should have taken was held by
-- another claimer and still has due runs (issue 16): the dispatcher then
-- claims again in milliseconds instead of sleeping until its next poke or
-- poll.
--
-- Step 1 of the claim takes turns with FOR NO KEY UPDATE SKIP LOCKED: while
-- another replica's claim holds a workspace's row, this one passes over it
-- and may come back with nothing. Its dispatcher then slept until a poke or
-- the poll (0.5 s) while runs were due and its executors had free slots: with
-- two replicas on one database, runs delivered to executors in a burst took
-- longer than with one (bench/claim_dispatch.py), the second replica's
-- executors idle while the first's were full.
--
-- Before the claim, the wrapper reads step 1's turns without the lock: the
-- workspaces step 1 takes when no other claimer holds one (due, room under
-- the cap, in scope, least recently served first, as many as the owners).
-- Step 2 marks every workspace whose turn it took served at the claim's
-- clock (last_served_at = coalesce(at, now()), one value for the whole
-- transaction) when it got runs or had none these owners could take; the one
-- that lost out only to a full batch keeps its place, but then the claim was
-- not short. So when the claim took fewer runs than it had owners, a
-- workspace of that read which is not marked, and is still due with room, is
-- one step 1 skipped because another claimer held it (or one that claimer
-- served meanwhile and left with due runs): there is a run to take now.
-- Workspaces whose due runs these owners cannot take (tools, release) are
-- served by every claim that takes their turn, so they never raise the flag,
-- however many there are. The read after the claim is a new statement (a
-- fresh snapshot): it sees the other claimers' commits and step 4's raise of
-- next_wake_at. The caps argument (sql/lease.sql) is untouched: neither read
-- locks anything or changes a count.
--
-- The flag is one more row, its run NULL, after the claimed runs: a claim that
-- took nothing can say it too. As 0030 did, agentrun_claim() becomes a wrapper:
-- 0030's function (the claim and its counts) is renamed agentrun_claim_counted
-- and called between the two reads, unchanged.

ALTER FUNCTION agentrun_claim(text[], double precision, timestamptz, text[], jsonb, text[],
                              text, double precision, boolean)
    RENAME TO agentrun_claim_counted;

CREATE FUNCTION agentrun_claim(
    owners text[], lease_seconds double precision, at timestamptz, scope text[],
    carried jsonb, continued text[], own_release text, live_seconds double precision,
    gated boolean)
RETURNS TABLE (run runs, held_seconds double precision, taken_over boolean, keeps_due boolean,
               others_due boolean)
LANGUAGE plpgsql VOLATILE
AS $claim$
#variable_conflict use_column
DECLARE
    claim_clock timestamptz := coalesce($3, now());
    expected text[];
    taken bigint;
BEGIN
    -- Step 1's turns, read without its lock.
    SELECT array_agg(t.workspace_id) INTO expected FROM (
        SELECT w.workspace_id FROM workspaces w
        CROSS JOIN LATERAL (
            SELECT coalesce(sum(n), 0) AS running FROM workspace_running_counts c
            WHERE c.workspace_id = w.workspace_id) c
        WHERE w.next_wake_at <= claim_clock
          AND c.running < w.max_concurrency
          AND ($4 IS NULL OR w.workspace_id = ANY($4))
        ORDER BY w.last_served_at, w.workspace_id
        LIMIT cardinality($1)
    ) t;
    RETURN QUERY SELECT c.run, c.held_seconds, c.taken_over, c.keeps_due, false
                 FROM agentrun_claim_counted($1, $2, $3, $4, $5, $6, $7, $8, $9) c;
    GET DIAGNOSTICS taken = ROW_COUNT;
    -- A workspace of that read left unserved, still due with room.
    IF taken < cardinality($1) AND EXISTS (
        SELECT 1 FROM workspaces w
        CROSS JOIN LATERAL (
            SELECT coalesce(sum(n), 0) AS running FROM workspace_running_counts c
            WHERE c.workspace_id = w.workspace_id) c
        WHERE w.workspace_id = ANY(expected)
          AND w.last_served_at IS DISTINCT FROM claim_clock
          AND w.next_wake_at <= claim_clock
          AND c.running < w.max_concurrency
    ) THEN
        RETURN QUERY SELECT NULL::runs, NULL::double precision, NULL::boolean, NULL::boolean,
                            true;
    END IF;
END
$claim$;
