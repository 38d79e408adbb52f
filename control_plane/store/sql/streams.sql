-- name: stream_get :one
-- A workspace's stream by path, with whether it has expired (database clock): past its
-- Stream-Expires-At, or its Stream-TTL since it was last read or written.
SELECT s.*,
       (s.expires_at IS NOT NULL AND s.expires_at <= now())
       OR (s.ttl_seconds IS NOT NULL
           AND s.accessed_at + s.ttl_seconds * interval '1 second' <= now()) AS expired
FROM streams s WHERE s.workspace_id = :workspace_id AND s.path = :path;

-- name: stream_lock :one
-- The stream row, locked for this transaction (appends, closes and deletes of one
-- stream are serialised on it), with whether it has expired.
SELECT s.*,
       (s.expires_at IS NOT NULL AND s.expires_at <= now())
       OR (s.ttl_seconds IS NOT NULL
           AND s.accessed_at + s.ttl_seconds * interval '1 second' <= now()) AS expired
FROM streams s WHERE s.workspace_id = :workspace_id AND s.path = :path
FOR UPDATE;

-- name: stream_insert :one
-- A new stream; NULL when the path is taken (a concurrent create won).
INSERT INTO streams (workspace_id, path, content_type, ttl_seconds, expires_at_text,
                     expires_at, tail_offset, closed, forked_from, fork_offset,
                     fork_sub_offset)
VALUES (:workspace_id, :path, :content_type, :ttl_seconds, :expires_at_text,
        :expires_at, :tail_offset, :closed, :forked_from, :fork_offset, :fork_sub_offset)
ON CONFLICT (workspace_id, path) DO NOTHING
RETURNING *, false AS expired;

-- name: stream_message_insert :exec
-- One append's bytes, ending at $2.
INSERT INTO stream_messages (workspace_id, stream_id, end_offset, data) VALUES ($1, $2, $3, $4);

-- name: stream_advance :exec
-- After appends: the new tail, closed or not, the closing producer and Stream-Seq, and
-- the access time a TTL counts from; NOTIFY readers on any replica (sent at commit).
WITH moved AS (
    UPDATE streams SET tail_offset = :tail_offset, closed = :closed, closed_by = :closed_by,
                       last_seq = :last_seq, accessed_at = now()
    WHERE workspace_id = :workspace_id AND stream_id = :stream_id
    RETURNING stream_id
)
SELECT pg_notify('agentrun_streams', stream_id::text) FROM moved;

-- name: stream_touch :exec
-- A read of a stream with a TTL: the TTL counts from now.
UPDATE streams SET accessed_at = now()
WHERE workspace_id = $1 AND stream_id = $2 AND ttl_seconds IS NOT NULL;

-- name: stream_messages_after :many
-- A stream's own messages after offset $3 up to $4 (inclusive), in order, at most $5.
SELECT end_offset, data FROM stream_messages
WHERE workspace_id = $1 AND stream_id = $2 AND end_offset > $3 AND end_offset <= $4
ORDER BY end_offset
LIMIT $5;

-- name: stream_by_id :one
-- A stream row by id (a fork's source).
SELECT * FROM streams WHERE workspace_id = $1 AND stream_id = $2;

-- name: stream_producer_get :one
-- A producer's last accepted (epoch, seq) on a stream (state older than 7 days is
-- forgotten, as the protocol allows).
SELECT epoch, last_seq FROM stream_producers
WHERE workspace_id = $1 AND stream_id = $2 AND producer_id = $3
  AND updated_at > now() - interval '7 days';

-- name: stream_producer_put :exec
-- A producer's accepted (epoch, seq). (updated_at from EXCLUDED: Citus allows no
-- function in DO UPDATE.)
INSERT INTO stream_producers (workspace_id, stream_id, producer_id, epoch, last_seq, updated_at)
VALUES ($1, $2, $3, $4, $5, now())
ON CONFLICT (workspace_id, stream_id, producer_id)
DO UPDATE SET epoch = EXCLUDED.epoch, last_seq = EXCLUDED.last_seq,
              updated_at = EXCLUDED.updated_at;

-- name: stream_delete :exec
-- Remove a stream and its messages and producers.
DELETE FROM streams WHERE workspace_id = $1 AND stream_id = $2;

-- name: stream_soft_delete :exec
-- Hide a stream that forks still read: its path stays taken until they are gone.
UPDATE streams SET soft_deleted = true WHERE workspace_id = $1 AND stream_id = $2;

-- name: stream_ref_add :one
-- A fork was made of (+1) or removed from (-1) this stream: its fork count after.
UPDATE streams SET ref_count = greatest(ref_count + $3, 0)
WHERE workspace_id = $1 AND stream_id = $2
RETURNING ref_count, soft_deleted;

-- name: stream_wake_all :exec
-- A stream was closed or removed: wake its readers on every replica.
SELECT pg_notify('agentrun_streams', $1::text);

-- name: stream_run_tail :one
-- A run's stream (read-only, projected from its step log): its status, its last step,
-- and the last delta of its model call under way (none once that decision committed);
-- and the private session it is a turn of (or below one), whose members alone may see it
-- (NULL: every reader may): the same for every reader, so that live readers share this
-- read and only a private session's need a membership check each (http/streams.py).
WITH r AS (
    SELECT r.workspace_id, r.run_id, r.status,
           (SELECT max(s.seq) FROM steps s
            WHERE s.workspace_id = r.workspace_id AND s.run_id = r.run_id) AS last_seq,
           (SELECT x.session_id FROM sessions x
            WHERE x.workspace_id = r.workspace_id AND x.session_id = r.session_id
              AND x.visibility = 'private') AS private_session
    FROM runs r WHERE r.workspace_id = $1 AND r.run_id = $2
)
SELECT r.status, r.last_seq, d.seq AS delta_seq, d.epoch AS delta_epoch, d.idx AS delta_idx,
       r.private_session
FROM r
LEFT JOIN LATERAL (
    SELECT seq, epoch, idx FROM run_deltas d
    WHERE d.workspace_id = r.workspace_id AND d.run_id = r.run_id
      AND d.seq > coalesce(r.last_seq, -1)
    ORDER BY seq DESC, epoch DESC, idx DESC LIMIT 1
) d ON true;

-- name: stream_session_tail :one
-- A session's stream (read-only): its last turn and that turn's run's last step, and
-- whether the session is private (its members alone may see it).
SELECT t.turn,
       (SELECT max(s.seq) FROM steps s
        WHERE s.workspace_id = t.workspace_id AND s.run_id = t.run_id) AS last_seq,
       x.visibility = 'private' AS private
FROM sessions x
LEFT JOIN LATERAL (
    SELECT * FROM session_turns t
    WHERE t.workspace_id = x.workspace_id AND t.session_id = x.session_id
    ORDER BY t.turn DESC LIMIT 1
) t ON true
WHERE x.workspace_id = $1 AND x.session_id = $2;

-- name: stream_session_steps :many
-- A session's turns' steps after (turn $3, step seq $4 - 1), in order, at most $5.
SELECT s.*, t.turn FROM session_turns t
JOIN steps s ON s.workspace_id = t.workspace_id AND s.run_id = t.run_id
WHERE t.workspace_id = $1 AND t.session_id = $2 AND (t.turn, s.seq + 1) > ($3, $4)
ORDER BY t.turn, s.seq
LIMIT $5;

-- name: feed_hidden :fragment
-- A workspace_events row `e` that reader :reader may not see (NULL sees everything): the
-- creation of a private session it is not a member of, or an event of a run of one (a turn
-- or anything below it: runs.session_id, migration 0053; run.created, run.state; approval.*
-- by detail.run_id).
-- Membership is read now, so a new member sees the session's past (migration 0051).
(:reader::text IS NOT NULL
 -- once per statement (no row of `e` in it): a workspace without private sessions stops here
 AND EXISTS (SELECT 1 FROM sessions p
             WHERE p.workspace_id = :workspace_id AND p.visibility = 'private')
 AND EXISTS (
    SELECT 1 FROM sessions x
    WHERE x.workspace_id = :workspace_id AND x.visibility = 'private'
      AND x.session_id IN (
          SELECT (CASE WHEN e.kind = 'session.created' THEN e.object_id END)::uuid
          UNION ALL
          SELECT r.session_id FROM runs r
          WHERE r.workspace_id = :workspace_id
            AND r.run_id = (CASE WHEN e.kind LIKE 'run.%' THEN e.object_id
                                 WHEN e.kind LIKE 'approval.%' THEN e.detail ->> 'run_id'
                            END)::uuid)
      AND NOT EXISTS (SELECT 1 FROM session_members m
                      WHERE m.workspace_id = :workspace_id AND m.session_id = x.session_id
                        AND m.member = :reader)))

-- name: stream_feed_after :many
-- The workspace feed after (xid :xid, event :event_id) as reader :reader sees it: events
-- of finished transactions only (below the snapshot's xmin), in (xid, event_id) order, at
-- most :page_size. Hidden events are skipped in the scan, so a page is never empty while
-- visible events follow, and the offsets served stay those of the events themselves.
SELECT e.event_id, e.xid::text AS xid, e.at, e.kind, e.object_id, e.detail
FROM workspace_events e
WHERE e.workspace_id = :workspace_id AND (e.xid, e.event_id) > (:xid::text::xid8, :event_id)
  AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
  AND NOT {{feed_hidden}}
ORDER BY e.xid, e.event_id
LIMIT :page_size;

-- name: stream_feed_tail :one
-- The workspace feed's last event reader :reader may be served now (see
-- stream_feed_after): its tail, which a hidden event never moves.
SELECT e.event_id, e.xid::text AS xid FROM workspace_events e
WHERE e.workspace_id = :workspace_id AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
  AND NOT {{feed_hidden}}
ORDER BY e.xid DESC, e.event_id DESC
LIMIT 1;

-- name: stream_deltas_put :exec
-- Model deltas heard from executors for runs of workspace $1 (arrays of one batch), each
-- kept once and only while its epoch still holds the run; a run's deltas of earlier calls
-- (committed decisions) are dropped as its next call streams. One workspace per
-- statement (control_plane/dispatch/delta_store.py splits a batch): on Citus, one shard.
WITH kept AS (
    INSERT INTO run_deltas (workspace_id, run_id, seq, epoch, idx, text)
    SELECT $1, d.run_id, d.seq, d.epoch, d.idx, d.text
    FROM unnest($2::uuid[], $3::int[], $4::bigint[], $5::int[], $6::text[])
        AS d(run_id, seq, epoch, idx, text)
    JOIN runs r ON r.workspace_id = $1 AND r.run_id = d.run_id
               AND r.lease_epoch = d.epoch AND r.status = 'running'
    -- a delta heard after its decision committed is too late: readers are past it
    WHERE NOT EXISTS (SELECT 1 FROM steps s WHERE s.workspace_id = $1
                      AND s.run_id = d.run_id AND s.seq >= d.seq)
    ON CONFLICT DO NOTHING
    RETURNING run_id, seq
)
DELETE FROM run_deltas x USING (
    SELECT run_id, min(seq) AS seq FROM kept GROUP BY run_id
) k
WHERE x.workspace_id = $1 AND x.run_id = k.run_id AND x.seq < k.seq;

-- name: stream_run_deltas :many
-- A run's deltas after (seq $4, position $5), in order, at most $6: those of its model
-- call under way (decision step $3 or later, not committed), and those of the call the
-- reader is inside of (seq $4, when $5 > 0: it finishes reading them, then the decision).
-- `taken_over`: the first delta of an epoch whose call an earlier epoch's holder had begun
-- to stream (the reader is shown the break before it).
SELECT seq, epoch, idx, text,
       idx = 0 AND EXISTS (SELECT 1 FROM run_deltas p
                           WHERE p.workspace_id = $1 AND p.run_id = d.run_id
                             AND p.seq = d.seq AND p.epoch < d.epoch) AS taken_over
FROM run_deltas d
WHERE workspace_id = $1 AND run_id = $2 AND (seq >= $3 OR ($5 > 0 AND seq = $4))
  AND (seq, epoch * 100000000 + idx + 1) > ($4, $5)
ORDER BY seq, epoch, idx
LIMIT $6;

-- name: stream_sweep_deltas :exec
-- Deltas of decisions committed more than $1 seconds ago (compacted: no longer served),
-- at most $2 of them.
DELETE FROM run_deltas x USING (
    SELECT d.workspace_id, d.run_id, d.seq, d.epoch, d.idx FROM run_deltas d
    WHERE d.created_at < now() - $1 * interval '1 second'
      AND EXISTS (SELECT 1 FROM steps s WHERE s.workspace_id = d.workspace_id
                  AND s.run_id = d.run_id AND s.seq >= d.seq)
    LIMIT $2
) old
WHERE x.workspace_id = old.workspace_id AND x.run_id = old.run_id AND x.seq = old.seq
  AND x.epoch = old.epoch AND x.idx = old.idx;

-- name: stream_sweep_feed :exec
-- Workspace feed events older than $1 days, at most $2 of them.
DELETE FROM workspace_events x USING (
    SELECT workspace_id, event_id FROM workspace_events
    WHERE at < now() - $1 * interval '1 day'
    LIMIT $2
) old
WHERE x.workspace_id = old.workspace_id AND x.event_id = old.event_id;

-- name: stream_sweep_expired :exec
-- Workspace streams past their TTL or Expires-At that nothing forks or was forked from
-- (those expire when next touched), at most $1 of them.
DELETE FROM streams x USING (
    SELECT workspace_id, stream_id FROM streams
    WHERE ref_count = 0 AND forked_from IS NULL
      AND ((expires_at IS NOT NULL AND expires_at <= now())
           OR (ttl_seconds IS NOT NULL
               AND accessed_at + ttl_seconds * interval '1 second' <= now()))
    LIMIT $1
) old
WHERE x.workspace_id = old.workspace_id AND x.stream_id = old.stream_id;
