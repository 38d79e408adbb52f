-- name: signal_lock_run :one
-- The run a signal is sent to, its row locked (FOR NO KEY UPDATE) until the transaction ends:
-- a run's deliveries are serial with each other and with its park commits
-- (migrations/0016_signals.sql says why that makes delivery exactly once).
SELECT status FROM runs WHERE workspace_id = $1 AND run_id = $2 FOR NO KEY UPDATE;

-- name: signal_insert :one
-- Store a signal in the run's mailbox; nothing (NULL) when its event id was used already.
INSERT INTO run_signals (workspace_id, run_id, event_id, name, payload, payload_sha256, sent_by)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)
ON CONFLICT (workspace_id, run_id, event_id) DO NOTHING
RETURNING event_id;

-- name: signal_get :one
-- One signal of a run, by its event id.
SELECT * FROM run_signals WHERE workspace_id = $1 AND run_id = $2 AND event_id = $3;

-- name: signal_deliver :one
-- Deliver the oldest pending signal to the run's open wait_for_signal call, if the run waits
-- on one (run_deliver_signal, migrations/0016_signals.sql); the result's seq, or NULL.
SELECT run_deliver_signal($1::text, $2::uuid) AS result_seq;

-- name: signals_of_run :many
-- A run's signals in order of arrival.
SELECT * FROM run_signals WHERE workspace_id = $1 AND run_id = $2 ORDER BY arrival;
