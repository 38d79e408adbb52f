"""Test harness: real PostgreSQL, Redis and project processes, and deadline-bound waiting.

    servers     the session's PostgreSQL and Redis (embedded, or DATABASE_URL / REDIS_URL)
    databases   the migrated template database and a copy of it per test
    processes   control plane, executors and sandboxes as subprocesses (port-file handshake)
    waiting     eventually(): wait for a condition with a deadline, never sleep to synchronise

The fixtures that tie these together live in tests/conftest.py.
"""
