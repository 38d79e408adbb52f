"""Local stand-ins for a model provider and tool providers, served over real HTTP.

* ``sandbox.model_server``: an OpenAI-compatible chat-completions server that
  plays scripted scenarios (``sandbox/scenarios/<model>.json``).
* ``sandbox.providers``: fake tool providers (payments, mail, chat, CRM, echo)
  under path prefixes of one app, every call and side effect recorded so tests
  can count them.
* ``python -m sandbox model|providers``: run either one (see ``sandbox.__main__``).

Both servers expose ``/_sandbox/requests`` (what they were asked) and
``/_sandbox/faults`` (outages, delays, lost responses) for tests and benchmarks;
the providers server also lists side effects at ``/_sandbox/effects``.
"""
