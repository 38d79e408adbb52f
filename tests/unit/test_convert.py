"""The hand-rolled row conversions give exactly what the library and the constructors give."""

from __future__ import annotations

import random
import uuid
from dataclasses import fields
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from control_plane.api import convert
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
        values += [moment, moment.replace(tzinfo=None),
                    moment.astimezone(timezone(timedelta(minutes=rng.randrange(-720, 720))))]  # fmt: skip
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
