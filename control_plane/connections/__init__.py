"""Connected accounts: OAuth grants a workspace holds at tool providers.

* `client.py` — the OAuth 2.0 client: authorize URL (code flow + PKCE S256), code exchange,
  refresh. Token values live only in `TokenAnswer` (never in a repr, log or error).
* `flows.py` — the start link and the callback: state and PKCE verifier kept server-side
  (state hashed, verifier sealed), the code exchanged, the pair sealed and stored.
* `tokens.py` — a connection's access token for a call about to leave, refreshed
  single-flight (an advisory lock across replicas, one task per connection in a replica).
* `triggering.py` — the sentinel `trigger`: a tool acts as the account the run came in through.
"""
