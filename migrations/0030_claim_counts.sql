-- The claim adds its runs to the running counts once per agent (issue 16).
--
-- A claim leases up to a batch of runs in one UPDATE (0029's agentrun_claim).
-- runs_fair_update, a row trigger, then added each run to the counts on its
-- own: two single-row UPDATEs of the same two shard-0 rows per run, 128 for a
-- batch of 64, each a new version of a row the batch had just updated. That
-- was 2.6 of the 6.9 ms a batch of 64 took in one workspace (EXPLAIN of the
-- call with and without the trigger).
--
-- Now agentrun_claim() is a wrapper: it runs the claim (0029's function,
-- renamed agentrun_claim_uncounted) with agentrun.claim_counts on, which the
-- trigger's WHEN reads to leave out the runs the claim leased fresh (those
-- entering 'running'), and then adds them itself, one running_counts_add()
-- per workspace and agent, in (workspace, agent) order. The same transaction,
-- the same shard (0, increments) and the same workspace lock (step 1's,
-- held until the transaction ends): the caps argument at the top of
-- sql/lease.sql is unchanged. A lapsed lease taken over stays 'running' and
-- never moved the counts. The setting is the wrapper's own (its SET clause):
-- it is off again when the wrapper returns or fails, so every other status
-- change, the fast path's lease included, is counted by the trigger as before,
-- and so is a direct call of agentrun_claim_uncounted().

ALTER FUNCTION agentrun_claim(text[], double precision, timestamptz, text[], jsonb, text[],
                              text, double precision, boolean)
    RENAME TO agentrun_claim_uncounted;

DROP TRIGGER runs_fair_update ON runs;
CREATE TRIGGER runs_fair_update AFTER UPDATE ON runs FOR EACH ROW
    WHEN ((OLD.status IS DISTINCT FROM NEW.status
           OR (NEW.status IN ('queued', 'waiting') AND NEW.wake_at IS DISTINCT FROM OLD.wake_at))
          AND NOT (NEW.status = 'running' AND OLD.status IS DISTINCT FROM 'running'
                   AND coalesce(current_setting('agentrun.claim_counts', true), '') = 'on'))
    EXECUTE FUNCTION runs_fair_on_update();

CREATE FUNCTION agentrun_claim(
    owners text[], lease_seconds double precision, at timestamptz, scope text[],
    carried jsonb, continued text[], own_release text, live_seconds double precision,
    gated boolean)
RETURNS TABLE (run runs, held_seconds double precision, taken_over boolean, keeps_due boolean)
LANGUAGE plpgsql VOLATILE
SET agentrun.claim_counts = 'on'
AS $claim$
#variable_conflict use_column
DECLARE
    out_runs runs[];
    out_held double precision[];
    out_taken boolean[];
    out_keeps boolean[];
BEGIN
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
    RETURN QUERY SELECT out_runs[i], out_held[i], out_taken[i], out_keeps[i]
                 FROM generate_subscripts(out_runs, 1) i;
END
$claim$;
