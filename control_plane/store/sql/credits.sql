-- Credits: a workspace's account, its append-only ledger and the runs' reservations.
--
-- Why a reservation is never taken twice. A reservation is made only for a run held
-- at the caller's epoch whose spend has reached what it reserved, under the run row's
-- lock; its chunk number is the run's credit_chunks + 1, read under that lock, and the
-- ledger's unique (workspace_id, run_id, kind, chunk) key is the backstop: the account
-- moves only by the ledger rows the statement inserted. A claim or commit retried after
-- a kill -9 either finds the reservation made (the run no longer owes, nothing happens)
-- or finds it was never made (the transaction died whole) and makes it once.
--
-- Lock order is always the run row, then the account row (here, in the finish trigger,
-- and in a grant, which wakes the parked runs before it touches the account), so two
-- of these never wait on each other in a circle.

-- name: credits_reserve :one
-- Reserve the next chunk for a run held at :epoch that has spent all it reserved: the
-- overdraft of the step that crossed the line plus up to a chunk ahead, as far as the
-- balance goes. When nothing is left ahead the run stops here, by the account's
-- policy: parks (wait_reason 'credits', woken by a grant) or fails, with a step saying
-- why. With :may_stop false (the commit ends with a tool call committed as started:
-- its request is about to leave, and stopping would leave it an unknown outcome) the
-- run goes on overdrawn and stops at its next commit. No row: nothing owed, or the
-- workspace is unlimited (no account). Every table is filtered by :workspace_id, not only
-- joined to it, and the stop time comes from `decided`: so a Citus coordinator routes the
-- statement to one shard (it refuses now() inside CASE in a write).
WITH held AS (
    SELECT r.workspace_id, r.run_id, r.lease_epoch, r.credit_chunks + 1 AS chunk,
           r.cost_micros - r.credits_reserved_micros AS owed
    FROM runs r
    WHERE r.workspace_id = :workspace_id AND r.run_id = :run_id AND r.lease_epoch = :epoch
      AND r.status = 'running' AND r.cost_micros >= r.credits_reserved_micros
    FOR NO KEY UPDATE
), locked_account AS (
    -- The account locked by a statement over it alone, after the run (EXISTS reads
    -- `held` first): Citus loses the columns of a locking join with another CTE when an
    -- insert reads it ("missing data for column "run_id"").
    SELECT a.workspace_id, a.balance_micros, a.chunk_micros, a.out_of_credits
    FROM credit_accounts a
    WHERE a.workspace_id = :workspace_id AND EXISTS (SELECT 1 FROM held)
    FOR NO KEY UPDATE
), account AS (
    SELECT h.workspace_id, h.run_id, h.lease_epoch, h.chunk, h.owed, a.out_of_credits,
           -- What it owes, then up to a chunk ahead out of what the balance has left.
           h.owed + greatest(0, least(a.chunk_micros, a.balance_micros - h.owed)) AS amount
    FROM held h JOIN locked_account a ON a.workspace_id = h.workspace_id
), reserved AS (
    INSERT INTO credit_ledger (workspace_id, kind, run_id, chunk, amount_micros)
    SELECT workspace_id, 'reserve', run_id, chunk, amount FROM account WHERE amount > 0
    ON CONFLICT DO NOTHING
    RETURNING workspace_id, run_id, amount_micros
), moved AS (
    UPDATE credit_accounts a SET
        balance_micros = a.balance_micros - r.amount_micros,
        reserved_micros = a.reserved_micros + r.amount_micros,
        updated_at = now()
    FROM reserved r
    WHERE a.workspace_id = :workspace_id AND a.workspace_id = r.workspace_id
), decided AS (
    SELECT a.*, coalesce(r.amount_micros, 0) AS took,
           coalesce(r.amount_micros, 0) > a.owed OR NOT :may_stop AS covered,
           'out of credits: workspace ' || a.workspace_id
               || '''s credit balance cannot cover the next step' AS why,
           now() AS now
    FROM account a LEFT JOIN reserved r ON r.run_id = a.run_id
), to_append AS (  -- the stop step
    -- (run_next_seq() inlined: on Citus this runs on the shard, where a function
    -- reading a distributed table is refused.)
    SELECT d.workspace_id, d.run_id,
           (SELECT coalesce(max(s.seq), -1) + 1 FROM steps s
            WHERE s.workspace_id = :workspace_id AND s.run_id = :run_id) AS seq,
           CASE WHEN d.out_of_credits = 'park' THEN 'park' ELSE 'finish' END AS kind,
           d.lease_epoch AS epoch, NULL::int AS ref_seq,
           CASE WHEN d.out_of_credits = 'park'
                THEN jsonb_build_object('wait_reason', 'credits', 'note', d.why)
                ELSE jsonb_build_object('status', 'failed', 'error', d.why) END AS payload,
           now() AS created_at, NULL::text AS release
    FROM decided d
    WHERE NOT d.covered
), {{steps_append}}
UPDATE runs r SET
    credits_reserved_micros = r.credits_reserved_micros + d.took,
    credit_chunks = r.credit_chunks + CASE WHEN d.took > 0 THEN 1 ELSE 0 END,
    status = CASE WHEN d.covered THEN r.status
                  WHEN d.out_of_credits = 'park' THEN 'waiting' ELSE 'failed' END,
    wait_reason = CASE WHEN d.covered THEN r.wait_reason
                       WHEN d.out_of_credits = 'park' THEN 'credits' END,
    -- Parked on an event: a grant sets wake_at.
    wake_at = CASE WHEN d.covered THEN r.wake_at END,
    lease_owner = CASE WHEN d.covered THEN r.lease_owner END,
    error = CASE WHEN NOT d.covered AND d.out_of_credits = 'fail' THEN d.why ELSE r.error END,
    finished_at = CASE WHEN NOT d.covered AND d.out_of_credits = 'fail' THEN d.now
                       ELSE r.finished_at END,
    step_count = r.step_count + CASE WHEN d.covered THEN 0 ELSE 1 END,
    updated_at = now()
FROM decided d
WHERE r.workspace_id = :workspace_id AND r.workspace_id = d.workspace_id AND r.run_id = d.run_id
RETURNING r.status, r.error, d.took AS reserved_micros;

-- name: credits_wake_parked :exec
-- A grant wakes the workspace's runs parked for credits (before the account is locked).
UPDATE runs SET wake_at = now(), updated_at = now()
WHERE workspace_id = $1 AND status = 'waiting' AND wait_reason = 'credits';

-- name: credits_grant :one
-- Add :amount to the workspace's account (creating it: from now on it is metered) and
-- record the grant; :chunk and :policy change the account's settings when not NULL.
WITH account AS (
    -- (updated_at comes in through excluded: Citus refuses now() in DO UPDATE SET.)
    INSERT INTO credit_accounts AS a (workspace_id, granted_micros, balance_micros,
                                      chunk_micros, out_of_credits, updated_at)
    VALUES (:workspace_id, :amount, :amount, coalesce(:chunk::bigint, 1000000),
            coalesce(:policy::text, 'park'), now())
    ON CONFLICT (workspace_id) DO UPDATE SET
        granted_micros = a.granted_micros + excluded.granted_micros,
        balance_micros = a.balance_micros + excluded.balance_micros,
        chunk_micros = coalesce(:chunk::bigint, a.chunk_micros),
        out_of_credits = coalesce(:policy::text, a.out_of_credits),
        updated_at = excluded.updated_at
    RETURNING a.*
), entry AS (
    INSERT INTO credit_ledger (workspace_id, kind, amount_micros, granted_by, note)
    SELECT workspace_id, 'grant', :amount, :granted_by, :note FROM account
)
SELECT * FROM account;

-- name: credits_account :one
-- A workspace's account (no row: unlimited).
SELECT * FROM credit_accounts WHERE workspace_id = $1;

-- name: credits_ledger_page :many
-- A page of a workspace's ledger, newest first, from entries before $2 (NULL: the newest);
-- only one run's entries when $3 is not NULL.
SELECT * FROM credit_ledger
WHERE workspace_id = $1 AND ($2::bigint IS NULL OR entry_id < $2)
  AND ($3::uuid IS NULL OR run_id = $3)
ORDER BY entry_id DESC
LIMIT $4;
