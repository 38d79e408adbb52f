"""What every run must satisfy after any crash: checked against real logs and sandbox records."""

from __future__ import annotations

from collections import Counter
from typing import Any

from control_plane.dispatch.requests import MAX_PAYLOAD_DEPTH
from control_plane.ground import validate
from tests.harness.agentrun_api import LoggedStep


def assert_no_reask(run_id: str, steps: list[LoggedStep], model_log: list[dict[str, Any]]) -> None:
    """No model request for a decision's (run, seq) came after the one that was committed."""
    mine = [r for r in model_log if r.get("run_id") == run_id]
    for step in (s for s in steps if s.kind == "model_decision"):
        committed = [r for r in mine if r["response_id"] == step.payload["response_id"]]
        assert len(committed) == 1, f"decision {step.seq}: response not in the model's log"
        later = [r for r in mine if r["seq"] == step.seq and r["n"] > committed[0]["n"]]
        assert later == [], f"run {run_id} re-asked committed decision {step.seq}: {later}"


def assert_writes_at_most_once(provider_log: list[dict[str, Any]], path: str) -> Counter:
    """Each idempotency key reached the write endpoint at most once; returns the counts."""
    keys = Counter(r["idempotency_key"] for r in provider_log if r["path"] == path)
    assert None not in keys, "a write went out without an Idempotency-Key"
    repeated = {k: n for k, n in keys.items() if n > 1}
    assert repeated == {}, f"writes repeated: {repeated}"
    return keys


def assert_log_well_formed(steps: list[LoggedStep]) -> None:
    """Contiguous seqs, epochs never going back, each started tool answered once, finish last."""
    assert [s.seq for s in steps] == list(range(len(steps)))
    epochs = [s.epoch for s in steps]
    assert epochs == sorted(epochs), f"an older epoch wrote after a newer one: {epochs}"
    started = {s.seq for s in steps if s.kind == "tool_started"}
    answered = Counter(s.ref_seq for s in steps if s.kind == "tool_result" and s.ref_seq in started)
    assert set(answered) == started and set(answered.values()) <= {1}
    assert steps[-1].kind == "finish"


def assert_effects_at_most_once(effects: list[dict[str, Any]], provider: str) -> Counter:
    """Each idempotency key caused at most one side effect at `provider`; returns the counts."""
    keys = Counter(e["key"] for e in effects if e["provider"] == provider)
    assert None not in keys, f"a {provider} side effect without a key: tests cannot count it"
    repeated = {k: n for k, n in keys.items() if n > 1}
    assert repeated == {}, f"{provider} side effects repeated: {repeated}"
    return keys


def stored_payload(text: str) -> Any:
    """A step's payload text read as the control plane and Postgres take it (no NUL, no
    NaN or Infinity, at most MAX_PAYLOAD_DEPTH deep); InvalidArgument naming it if not."""
    return validate.json_value("payload_json", text, max_depth=MAX_PAYLOAD_DEPTH)
