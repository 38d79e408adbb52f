"""The hand-rolled row conversions give exactly what the library and the constructors give."""

from __future__ import annotations

import random
import uuid
from dataclasses import fields
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from agentrun.v1 import agent_pb2, executor_pb2, run_pb2
from control_plane.dispatch import dispatcher
from control_plane.ground import convert
from control_plane.store.runs import Run
from control_plane.store.steps import Step


def _library(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def test_timestamp_is_what_from_datetime_gives() -> None:
    rng = random.Random(16)
    values = [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),  # just before the epoch
        datetime(1901, 5, 3, 1, 2, 3, 456_789, tzinfo=UTC),
        datetime(2030, 1, 1, 12, 0, 0, 1),  # naive: UTC
        datetime(2026, 12, 2, 1, 0, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
    ]
    for _ in range(2_000):
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
            microseconds=rng.randrange(-(10**16), 10**16)
        )
        values += [
            moment,
            moment.replace(tzinfo=None),
            moment.astimezone(timezone(timedelta(minutes=rng.randrange(-720, 720)))),
        ]
    for value in values:
        assert convert.timestamp(value) == _library(value), value


def test_timestamp_leaves_out_none_and_the_extremes() -> None:
    assert convert.timestamp(None) is None
    assert convert.timestamp(datetime.min) is None
    assert convert.timestamp(datetime.max) is None
    assert not convert.run_pb2.Run(wake_time=convert.timestamp(None)).HasField("wake_time")


def _values(cls: type, seed: int) -> dict[str, object]:
    now = datetime(2026, 12, 2, 1, 2, 3, 456_789, tzinfo=UTC)
    samples: dict[str, object] = {"str": "x", "int": seed, "float": 1.5, "bool": True}
    out: dict[str, object] = {}
    for f in fields(cls):
        kind = str(f.type)
        if "datetime" in kind:
            out[f.name] = now + timedelta(seconds=seed)
        elif "UUID" in kind:
            out[f.name] = uuid.UUID(int=seed + 1)
        else:
            out[f.name] = next(v for k, v in samples.items() if k in kind)
    # Values the messages map (an enum each).
    return {**out, **{k: v for k, v in (("status", "running"), ("kind", "input")) if k in out}}


def test_run_from_record_is_the_constructors_run() -> None:
    record = _values(Run, 7)
    built = Run.from_record(record)  # type: ignore[arg-type]
    assert built == Run(**record)  # type: ignore[arg-type]
    assert hash(built) == hash(Run(**record))  # type: ignore[arg-type]
    assert convert.run(built) == convert.run(Run(**record))  # type: ignore[arg-type]


def test_step_of_is_the_constructors_step() -> None:
    record = _values(Step, 3)
    assert Step.of(record) == Step(**record)  # type: ignore[arg-type]
    assert convert.step(Step.of(record)) == convert.step(Step(**record))  # type: ignore[arg-type]


def test_a_missing_column_is_named() -> None:
    record = _values(Run, 1)
    del record["priority"]
    with pytest.raises(KeyError, match="priority"):
        Run.from_record(record)  # type: ignore[arg-type]


def _library_duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def _constructed_run(row: Run) -> run_pb2.Run:
    """The Run message as the constructors and the library build it, field by field."""
    ts = lambda v: _library(v) if v is not None else None  # noqa: E731
    return run_pb2.Run(
        workspace_id=row.workspace_id,
        run_id=str(row.run_id),
        agent_id=row.agent_id,
        agent_version=row.agent_version,
        status=convert.STATUS_TO_PROTO[row.status],
        wait_reason=row.wait_reason or "",
        lease_owner=row.lease_owner or "",
        lease_epoch=row.lease_epoch,
        attempt=row.attempt,
        limits=agent_pb2.RunLimits(
            max_steps=row.max_steps,
            deadline=_library_duration(row.deadline_seconds),
            max_tokens=row.max_tokens,
            max_tool_calls=row.max_tool_calls,
            model_retry_budget=row.model_retry_budget,
            max_age=_library_duration(row.max_age_seconds) if row.max_age_seconds else None,
            repeat_limit=row.repeat_limit,
            context_tokens=row.context_tokens,
        ),
        counters=run_pb2.RunCounters(
            steps=row.step_count,
            model_calls=row.model_calls,
            tool_calls=row.tool_calls,
            tokens=row.tokens_used,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            cached_tokens=row.cached_tokens,
            reasoning_tokens=row.reasoning_tokens,
            cost_micros=row.cost_micros,
            refused_calls=row.refused_calls,
        ),
        input=row.input,
        output=row.output or "",
        error=row.error or "",
        active_duration=_library_duration(row.active_seconds + row.held_seconds),
        parent_run_id=str(row.parent_run_id) if row.parent_run_id else "",
        parent_seq=row.parent_seq or 0,
        forked_from_run_id=str(row.forked_from_run_id) if row.forked_from_run_id else "",
        forked_from_seq=row.forked_from_seq or 0,
        credits_reserved_micros=row.credits_reserved_micros,
        credit_chunks=row.credit_chunks,
        release=row.release or "",
        priority=row.priority,
        outcome=convert.outcome(row.status, row.refused_calls, row.tool_calls)
        if row.finished_at is not None
        else run_pb2.RUN_OUTCOME_UNSPECIFIED,
        tags=list(row.tags),
        metadata_json=row.metadata,
        paused=row.paused,
        parent_index=row.parent_index,
        parent_close=row.parent_close,
        concurrency_key=row.concurrency_key,
        wake_time=ts(row.wake_at),
        expire_time=ts(row.expires_at),
        create_time=ts(row.created_at),
        update_time=ts(row.updated_at),
        finish_time=ts(row.finished_at),
    )


OPTIONAL_NONE = {
    "wait_reason": None,
    "wake_at": None,
    "lease_owner": None,
    "request_id": None,
    "output": None,
    "error": None,
    "expires_at": None,
    "held_since": None,
    "started_by": None,
    "waiting_connection_id": None,
    "parent_run_id": None,
    "parent_seq": None,
    "forked_from_run_id": None,
    "forked_from_seq": None,
    "release": None,
    "started_at": None,
    "finished_at": None,
    "max_age_seconds": 0,
    "active_seconds": 0.0,
    "held_seconds": 0.0,
}


def test_a_duration_is_what_from_nanoseconds_gives() -> None:
    rng = random.Random(16)
    values = [0, 0.0, 1, 86_400, 1.5, 2.25, 1e-9, -1, -1.5, -1e-9, 10**9 + 0.123456789]
    values += [rng.uniform(-1e6, 1e6) for _ in range(2_000)] + [
        rng.randrange(10**7) for _ in range(500)
    ]
    for value in values:
        d = Duration()
        convert.set_duration(d, value)
        assert d == _library_duration(value), value


# A fresh run: every count, the attempt, the priority and the credits at 0 as well.
ZEROS = {
    **OPTIONAL_NONE,
    "attempt": 0,
    "priority": 0,
    "step_count": 0,
    "model_calls": 0,
    "tool_calls": 0,
    "tokens_used": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    "cached_tokens": 0,
    "reasoning_tokens": 0,
    "cost_micros": 0,
    "credits_reserved_micros": 0,
    "credit_chunks": 0,
    "context_tokens": 0,
    "input": "",
    "wait_reason": "",
    "release": "",
}


@pytest.mark.parametrize(
    "overrides",
    [{"held_seconds": 2.25, "priority": -2}, OPTIONAL_NONE, ZEROS],
    ids=["every field set", "optional ones unset", "defaults (0, empty, none)"],
)
def test_a_run_written_in_place_is_the_constructed_message(overrides: dict[str, object]) -> None:
    """convert.run and the Assignment's run (filled in place, not built and copied) carry
    exactly what the constructors and the library's conversions give, presence included."""
    unset = "wake_at" in overrides  # the optional ones unset
    record = {**_values(Run, 11), **overrides}
    row = Run(**record)  # type: ignore[arg-type]
    expected = _constructed_run(row)
    assert convert.run(row) == expected
    for name in ("wake_time", "finish_time"):
        assert convert.run(row).HasField(name) is not unset
    assert convert.run(row).limits.HasField("max_age") is not unset
    step_record = _values(Step, 5)
    step = Step(**step_record)  # type: ignore[arg-type]
    assignment = executor_pb2.Assignment()
    dispatcher.set_assignment(assignment, row, agent_pb2.AgentVersion(version=3), [step, step], 1.0)
    assert assignment.run == expected
    constructed_step = run_pb2.Step(
        run_id=str(step.run_id),
        seq=step.seq,
        kind=run_pb2.STEP_KIND_INPUT,
        epoch=step.epoch,
        ref_seq=step.ref_seq or 0,
        payload_json=step.payload,
        create_time=_library(step.created_at),
        release=step.release or "",
    )
    assert list(assignment.steps) == [constructed_step, constructed_step]
    assert convert.step(step) == constructed_step


@pytest.mark.parametrize(
    ("status", "refused", "started", "outcome"),
    [
        ("completed", 0, 3, run_pb2.RUN_OUTCOME_COMPLETED),
        ("completed", 2, 1, run_pb2.RUN_OUTCOME_COMPLETED_WITH_REFUSALS),
        # Every call refused, none started: the answer is all it did, no success.
        ("completed", 1, 0, run_pb2.RUN_OUTCOME_ONLY_REFUSED),
        ("failed", 1, 0, run_pb2.RUN_OUTCOME_FAILED),
        ("cancelled", 0, 0, run_pb2.RUN_OUTCOME_CANCELLED),
        ("running", 1, 0, run_pb2.RUN_OUTCOME_UNSPECIFIED),
    ],
)
def test_a_finished_runs_outcome_says_what_its_refused_calls_did(
    status: str, refused: int, started: int, outcome: int
) -> None:
    assert convert.outcome(status, refused, started) == outcome
