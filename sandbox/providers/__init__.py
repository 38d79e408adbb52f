"""Fake tool providers (CRM, echo, mail) served by one app under path prefixes.

Each provider is a small module with a class that has a ``name``, a list of
``Endpoint``s and a ``reset()`` (see ``base.py``); handlers take a parsed
``ProviderRequest`` and return a response. ``app.py`` wraps every endpoint the
same way: an armed fault for that provider is applied, the call is recorded
in the shared request log (with its Idempotency-Key and body), then answered.
So a provider module only implements its own behaviour: a payments provider
that replays by Idempotency-Key, say, keeps its own key table and is added as
``payments.py`` plus one line in ``app.PROVIDERS``.

Fault modes (``POST /_sandbox/faults``): ``error`` and ``rate_limit`` answer
without the side effect; ``delay`` waits then answers normally;
``drop_response`` performs and records the side effect, waits, then breaks the
connection, so the caller cannot know whether it happened.
"""

from sandbox.providers.app import PROVIDERS, ProviderSandbox, create_app

__all__ = ["PROVIDERS", "ProviderSandbox", "create_app"]
