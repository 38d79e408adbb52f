"""Dispatch: the control plane's side of the executor stream.

Each `ExecutorService.Connect` stream is one `ExecutorSession`. The session
asks for nothing itself: the executor sends `Ready{slots}` credits, and the
replica's single `Dispatcher` turns the credits of all its sessions into one
claim statement per batch (`FOR UPDATE SKIP LOCKED`, database clock), so a
hundred executors on a replica cost one query, not a hundred.

A claim bumps the run's `lease_epoch` and sets `wake_at = now() + lease`.
From then on every write the executor sends carries that epoch, and the
store's commit checks it in the same statement that appends the steps. The
session holds no run state worth keeping: if the replica dies, executors
reconnect elsewhere, re-send their commits (idempotent by epoch and seq) and
their heartbeats, and nothing is lost. A run whose executor vanished becomes
due when its lease lapses, and the same claim hands it on.
"""
