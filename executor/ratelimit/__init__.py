"""Shared rate limits for tool calls: token buckets in Redis, parks instead of waits.

Five agents sending through one mailbox share that mailbox's limit, so the
limit lives in Redis, keyed by (provider, connection_id), with one more
bucket per provider for the platform's own quota (our OAuth app). Every
request to a provider takes a token from both, atomically (token_bucket.lua),
right before it leaves; the tool HTTP client does this for the first send, a
retry and a resend on resume alike, so no request goes around the limit.

No executor ever waits on a rate limit. With no token, the run commits a
park (wait_reason `rate`) whose wake time is when a token will be there, and
the slot goes to another run. Callers that find a bucket empty are handed
successive wake times, one token apart, so parked runs come back one at a
time. A provider's 429 is honoured: its Retry-After blocks the bucket, the
bucket's rate is lowered for a cool-down, and the run parks. If Redis cannot
be reached, runs park with backoff (the request is never sent without a
token) and the failure is logged and counted (`LimiterMetrics`).

The park says the held-back request never reached the provider (parks.py),
so the run sends it again under the same key when it wakes.
"""
