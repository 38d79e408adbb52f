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
-- took nothing can say it too.

DROP FUNCTION agentrun_claim(text[], double precision, timestamptz, text[], jsonb, text[],
                             text, double precision, boolean);

CREATE FUNCTION agentrun_claim(
    owners text[], lease_seconds double precision, at timestamptz, scope text[],
    carried jsonb, continued text[], own_release text, live_seconds double precision,
    gated boolean)
RETURNS TABLE (run runs, held_seconds double precision, taken_over boolean, keeps_due boolean,
               others_due boolean)
LANGUAGE plpgsql VOLATILE
SET agentrun.claim_counts = 'on'
AS $claim$
#variable_conflict use_column
DECLARE
    out_runs runs[];
    out_held double precision[];
    out_taken boolean[];
    out_keeps boolean[];
    claim_clock timestamptz := coalesce($3, now());
    expected text[];
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
    SELECT array_agg(c.run ORDER BY c.ord), array_agg(c.held_seconds ORDER BY c.ord),
           array_agg(c.taken_over ORDER BY c.ord), array_agg(c.keeps_due ORDER BY c.ord)
    INTO out_runs, out_held, out_taken, out_keeps
    FROM agentrun_claim_uncounted(owners, lease_seconds, at, scope, carried, continued,
                                  own_release, live_seconds, gated)
         WITH ORDINALITY AS c(run, held_seconds, taken_over, keeps_due, ord);
    -- The fresh runs (not taken over: those were 'running' already), by workspace and agent.
    PERFORM running_counts_add(f.workspace_id, f.agent_id, f.n)
    FROM (
        SELECT (out_runs[i]).workspace_id, (out_runs[i]).agent_id, count(*) AS n
        FROM generate_subscripts(out_runs, 1) i
        WHERE NOT out_taken[i]
        GROUP BY 1, 2
        ORDER BY 1, 2
    ) f;
    RETURN QUERY SELECT out_runs[i], out_held[i], out_taken[i], out_keeps[i], false
                 FROM generate_subscripts(out_runs, 1) i;
    -- A workspace of that read left unserved, still due with room.
    IF coalesce(cardinality(out_runs), 0) < cardinality($1) AND EXISTS (
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
