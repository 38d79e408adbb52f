-- name: delta_notify :exec
-- Tell every replica listening on channel $1 the payload $2 (under 8000 bytes): the fast
-- path's model deltas and who watches them (control_plane/dispatch/delta_relay.py). Not
-- stored anywhere: a replica not listening at that moment never hears it.
SELECT pg_notify($1, $2);
