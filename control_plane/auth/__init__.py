"""Identity: who is calling, and what they may do.

Every caller presents a credential: a workspace API key (bound to one
workspace, a role and a principal name), a signed-in person (an OpenID
Connect ID token), an executor credential (scoped to the workspaces its pool
may serve) or a platform admin key. One gRPC interceptor and one HTTP guard
turn the credential into a `Principal` and set it for the request
(`context.current()`); servicers never read credentials themselves. The
workspace of a request comes from the principal, never from what the caller
types: a request's `workspace_id`, where the API keeps one, must match it or
be empty (`context.workspace()`).
"""
