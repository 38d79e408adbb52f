"""Fake tool providers served by one app under path prefixes, each faithful to its class.

* ``payments`` — Idempotency-Key dedupe as Stripe does it (``provider_key``);
* ``mail`` — no dedupe, but sent messages are searchable by a stamped header (``lookup``);
* ``chat`` — neither key nor lookup (``none``);
* ``crm`` — lookups, and upserts that are idempotent by the contact's email;
* ``echo`` — a harmless read;
* ``slack`` — Slack's Web API chat.postMessage and chat.update, for notification channels;
* ``shop`` — serves its own OpenAPI 3 document (two reads, one keyed write).

Each provider is a small module with a class that has a ``name``, a list of
``Endpoint``s and a ``reset()`` (see ``base.py``); handlers take a parsed
``ProviderRequest`` and return a response. ``app.py`` wraps every endpoint the
same way: an armed fault for that provider is applied, the call is recorded
in the shared request log (with its Idempotency-Key and body), then answered.
So a provider module only implements its own behaviour (the payments provider
keeps its own key table, say) and is added as a module plus one line in
``app.PROVIDERS``.

Fault modes (``POST /_sandbox/faults``, per provider, endpoint, run or call:
see ``sandbox.faults``): ``error`` and ``rate_limit`` answer without the side
effect; ``delay`` slows the provider's processing, then answers normally;
``drop_response`` performs and records the side effect, waits, then breaks the
connection, so the caller cannot know whether it happened. Every side effect
is listed by ``GET /_sandbox/effects`` with the key of the request that caused it.
"""

from sandbox.providers.app import PROVIDERS, ProviderSandbox, create_app

__all__ = ["PROVIDERS", "ProviderSandbox", "create_app"]
