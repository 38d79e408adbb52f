"""Store-level errors: what a guarded write found instead of success, and which driver
errors mean the database could not be reached. Nothing outside the store names asyncpg's
exceptions: it asks `unavailable(exc)` / `transient(exc)` or catches these classes."""

from __future__ import annotations

import asyncpg


class StoreError(Exception):
    """Base of errors raised at the store's edge."""


class Fenced(StoreError):
    """The run is no longer held under the caller's epoch."""


class CommitConflict(Fenced):
    """A commit's seqs are taken by steps of another epoch or kind."""


class DatabaseUnavailable(StoreError):
    """Postgres could not be reached; nothing is known to have been written."""


class DataRefused(StoreError):
    """Postgres refused a value (a NUL in text, a number out of range, malformed JSON):
    the caller's input, not a fault of the database; nothing was written."""


# Any error a store call can raise (for loops that log it and try again later).
DATABASE_ERRORS: tuple[type[Exception], ...] = (StoreError, asyncpg.PostgresError)

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    DatabaseUnavailable,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.InterfaceError,
    ConnectionError,
    OSError,
)

_TRANSIENT: tuple[type[BaseException], ...] = (
    *_UNAVAILABLE,
    asyncpg.exceptions.PostgresConnectionError,  # class 08: the connection broke
    asyncpg.exceptions.OperatorInterventionError,  # class 57: shutting down, restarting
    asyncpg.exceptions.InsufficientResourcesError,  # class 53: too many connections, disk full
    TimeoutError,
)


def unavailable(exc: BaseException) -> bool:
    """The database could not be reached: the caller is told UNAVAILABLE."""
    return isinstance(exc, _UNAVAILABLE)


def transient(exc: BaseException) -> bool:
    """The database could not be reached (or is restarting): the same write may be retried
    later and nothing is known to have been written. Anything else is a bug or a refusal."""
    return isinstance(exc, _TRANSIENT)


def deadlock(exc: BaseException) -> bool:
    """Postgres aborted this transaction to break a deadlock: nothing was written, and the
    same transaction may simply be tried again."""
    return isinstance(exc, asyncpg.DeadlockDetectedError)
