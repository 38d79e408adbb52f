-- Push sources fetch on a connection's own OAuth token (issue 43).
--
-- A mailbox's history API wants the mailbox owner's access token. A push trigger now names a
-- connection (its config's connection_id) and fetches with that connection's token. When the
-- connection cannot be used (revoked, needs its owner to connect again), the fetch is parked
-- rather than retried every lease: fetch_error says why, on the trigger, until a fetch works.
ALTER TABLE triggers ADD COLUMN fetch_error text;
