"""The web console: server-rendered pages under /console/ on the HTTP ingress.

Sign-in. People sign in with OpenID Connect (the authorization-code flow with
PKCE, a state and a nonce, against the issuer's discovery document; the ID token
is verified by the replica's one `OidcVerifier`, as gRPC's are); operators paste
an API key, resolved by the shared `Resolver`. Either way the browser gets an
opaque random session token in an HttpOnly, SameSite=Strict cookie (Secure
unless the page is plain HTTP on a loopback address); the database keeps only
its SHA-256 and the principal (store/console.py). A key's session ends when
the key is revoked; a person's when they stop being a member.

Every page runs inside `context.acting_as(principal)` and reads through the same
domain and store functions as the gRPC servicers, in the principal's workspace
only, with the same capability table (auth/access.py): another workspace's run
is simply not found. Decisions reuse the domain: approvals go through
`approvals.decisions.decide`, unknown outcomes through `api.runs.resolve_unknown`,
and the live timeline reads `api.runs.watch_feed`, WatchRun's feed.

Forms. Every POST carries a CSRF token bound to the cookie (a keyed hash of the
session token; before sign-in, of a sign-in cookie), compared in constant time;
without it the POST is refused with 403. Pages send a strict
Content-Security-Policy (`default-src 'self'`, no inline script or style, no
framing) and load nothing from third parties: one CSS and one JS file are
served from /console/static/.
"""
