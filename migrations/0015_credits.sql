-- Credits and cost per run (issue 12 item 4, issue 13 item 5). Every model call and
-- tool call is priced at commit time (control_plane/pricing.py) and summed on the run in
-- the commit's own statement. A workspace with a credit account pays for its runs out of
-- reservations: a run reserves a chunk before its first step (at claim) and tops up in
-- chunks when its spend reaches what it reserved (at commit); each reservation is keyed
-- (run_id, chunk), and the chunk number comes from the locked run row, so a retried
-- claim or commit finds the reservation made and never takes a second one. When the run
-- ends, whatever path ends it (a commit, a cancel, a deadline, a max age), the trigger
-- below settles it in the same transaction: its spend moves to `spent` and the unused
-- rest returns to the balance. A workspace without an account row is unlimited.
--
-- The identity the ledger keeps, at every commit: granted = balance + reserved + spent,
-- where `reserved` is what live runs hold (including what they have spent so far) and
-- `spent` is what ended runs used. The balance may go below zero by at most the step
-- that crossed the line: a step already paid at the provider is always recorded.

CREATE TABLE credit_accounts (
    workspace_id     text PRIMARY KEY REFERENCES workspaces,
    granted_micros   bigint NOT NULL DEFAULT 0,
    balance_micros   bigint NOT NULL DEFAULT 0,
    reserved_micros  bigint NOT NULL DEFAULT 0 CHECK (reserved_micros >= 0),
    spent_micros     bigint NOT NULL DEFAULT 0 CHECK (spent_micros >= 0),
    -- How much a run reserves at a time.
    chunk_micros     bigint NOT NULL DEFAULT 1000000 CHECK (chunk_micros > 0),
    -- What a run does when its reservation is spent and the balance is empty.
    out_of_credits   text NOT NULL DEFAULT 'park' CHECK (out_of_credits IN ('park', 'fail')),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT credits_balance CHECK (granted_micros = balance_micros + reserved_micros + spent_micros)
);

-- Append-only. A grant moves granted and balance up; a reserve moves balance to
-- reserved; a run's end writes its spend (reserved to spent) and its release (reserved
-- back to balance; negative when the last step overdrew the reservation).
CREATE TABLE credit_ledger (
    workspace_id   text NOT NULL REFERENCES credit_accounts,
    entry_id       bigint GENERATED ALWAYS AS IDENTITY,
    kind           text NOT NULL CHECK (kind IN ('grant', 'reserve', 'spend', 'release')),
    run_id         uuid,
    chunk          integer NOT NULL DEFAULT 0,
    amount_micros  bigint NOT NULL,
    granted_by     text,
    note           text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, entry_id),
    CONSTRAINT ledger_run_entries CHECK ((kind = 'grant') = (run_id IS NULL)),
    CONSTRAINT ledger_grant_positive CHECK (kind <> 'grant' OR amount_micros > 0),
    CONSTRAINT ledger_reserve_positive CHECK (kind <> 'reserve' OR (amount_micros > 0 AND chunk > 0))
);

-- The key that makes a retried reservation (or settlement) a no-op.
CREATE UNIQUE INDEX credit_ledger_run_key ON credit_ledger (workspace_id, run_id, kind, chunk)
    WHERE run_id IS NOT NULL;

ALTER TABLE runs
    ADD COLUMN input_tokens            bigint NOT NULL DEFAULT 0,
    ADD COLUMN output_tokens           bigint NOT NULL DEFAULT 0,
    ADD COLUMN cached_tokens           bigint NOT NULL DEFAULT 0,
    ADD COLUMN reasoning_tokens        bigint NOT NULL DEFAULT 0,
    ADD COLUMN cost_micros             bigint NOT NULL DEFAULT 0,
    -- Credits this run reserved, in credit_chunks reservations (0: not metered).
    ADD COLUMN credits_reserved_micros bigint NOT NULL DEFAULT 0,
    ADD COLUMN credit_chunks           integer NOT NULL DEFAULT 0;

-- Settle a metered run when it ends, in the transaction that ends it. The ledger rows
-- are written first and the account moves only by what they inserted, so a second
-- settlement of the same run (it cannot end twice, but the key says so) moves nothing.
CREATE FUNCTION runs_credits_on_finish() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    settled integer;
BEGIN
    WITH entries AS (
        INSERT INTO credit_ledger (workspace_id, kind, run_id, chunk, amount_micros)
        VALUES (NEW.workspace_id, 'spend', NEW.run_id, 0, NEW.cost_micros),
               (NEW.workspace_id, 'release', NEW.run_id, 0,
                NEW.credits_reserved_micros - NEW.cost_micros)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO settled FROM entries;
    IF settled = 2 THEN
        UPDATE credit_accounts SET
            balance_micros = balance_micros + NEW.credits_reserved_micros - NEW.cost_micros,
            reserved_micros = reserved_micros - NEW.credits_reserved_micros,
            spent_micros = spent_micros + NEW.cost_micros,
            updated_at = now()
        WHERE workspace_id = NEW.workspace_id;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_credits_finish AFTER UPDATE OF status ON runs FOR EACH ROW
    WHEN (NEW.credit_chunks > 0
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION runs_credits_on_finish();
