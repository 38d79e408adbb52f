"""Store-level errors: what a guarded write found instead of success."""

from __future__ import annotations


class StoreError(Exception):
    """Base of errors raised at the store's edge."""


class Fenced(StoreError):
    """The run is no longer held under the caller's epoch."""


class CommitConflict(Fenced):
    """A commit's seqs are taken by steps of another epoch or kind."""


class DatabaseUnavailable(StoreError):
    """Postgres could not be reached; nothing is known to have been written."""
