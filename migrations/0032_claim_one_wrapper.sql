-- The claim's bookkeeping in one wrapper, its running counts in two
-- statements (issue 16).
--
-- Since 0031 a claim ran three PL/pgSQL functions deep: agentrun_claim()
-- (0031: the others_due reads) called agentrun_claim_counted() (0030: the
-- counts), which called agentrun_claim_uncounted() (0029: the four steps).
-- Each layer held the claimed runs rows once more, and 0030 moved the counts
-- with one running_counts_add() call per workspace and agent: a claim over 64
-- workspaces made 64 function calls and 128 single-row UPDATEs after its
-- claim. Side by side on one server (a batch of 64 over 100 workspaces, 60
-- claims a try, four tries each, alternated), the median claim took 5.97-6.57
-- ms as before, 5.58-5.70 with the counts moved by two statements and
-- 5.44-5.68 with that and one wrapper. The claim is the dispatcher's whole
-- critical path (bench/claim_dispatch.py: one replica waits on it, not on
-- delivery).
--
-- Now agentrun_claim() is one wrapper around 0029's steps, which are
-- unchanged: 0031's read before the claim, the claim, then the counts as two
-- INSERT ... ON CONFLICT DO UPDATE statements (every fresh run's workspace,
-- then every (workspace, agent), each once, in key order), then 0031's
-- others_due read. What each count row receives is what 0030's calls added,
-- in the same transaction, to the same shard 0. Only the order of those
-- writes changed, and it cannot deadlock: shard 0 of a workspace is written
-- only by the holder of the workspace's row lock (0027), and a claim counts
-- only runs of the workspaces whose locks it took in step 1. Decrements go
-- to the other shards, as before. The setting that keeps the row trigger
-- from counting the claimed runs twice (agentrun.claim_counts) is this
-- wrapper's now; agentrun_claim_uncounted() called alone still leaves its
-- runs to the trigger. agentrun_claim_counted() is dropped: nothing calls it.

CREATE OR REPLACE FUNCTION agentrun_claim(
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
    claim_clock timestamptz := coalesce($3, now());
    expected text[];
    out_runs runs[];
    out_held double precision[];
    out_taken boolean[];
    out_keeps boolean[];
BEGIN
    -- Step 1's turns, read without its lock (0031).
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
    -- The four steps (0029).
    SELECT array_agg(c.run ORDER BY c.ord), array_agg(c.held_seconds ORDER BY c.ord),
           array_agg(c.taken_over ORDER BY c.ord), array_agg(c.keeps_due ORDER BY c.ord)
    INTO out_runs, out_held, out_taken, out_keeps
    FROM agentrun_claim_uncounted(owners, lease_seconds, at, scope, carried, continued,
                                  own_release, live_seconds, gated)
         WITH ORDINALITY AS c(run, held_seconds, taken_over, keeps_due, ord);
    -- The fresh runs (a run taken over was 'running' already) added to shard 0 of
    -- their workspace's count and of their agent's.
    INSERT INTO workspace_running_counts AS c (workspace_id, shard, n)
    SELECT (out_runs[i]).workspace_id, 0, count(*)
    FROM generate_subscripts(out_runs, 1) i
    WHERE NOT out_taken[i]
    GROUP BY 1
    ORDER BY 1
    ON CONFLICT (workspace_id, shard) DO UPDATE SET n = c.n + excluded.n;
    INSERT INTO agent_running_counts AS c (workspace_id, agent_id, shard, n)
    SELECT (out_runs[i]).workspace_id, (out_runs[i]).agent_id, 0, count(*)
    FROM generate_subscripts(out_runs, 1) i
    WHERE NOT out_taken[i]
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (workspace_id, agent_id, shard) DO UPDATE SET n = c.n + excluded.n;
    RETURN QUERY SELECT out_runs[i], out_held[i], out_taken[i], out_keeps[i], false
                 FROM generate_subscripts(out_runs, 1) i;
    -- A workspace of that read left unserved, still due with room (0031).
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

DROP FUNCTION agentrun_claim_counted(text[], double precision, timestamptz, text[], jsonb,
                                     text[], text, double precision, boolean);
