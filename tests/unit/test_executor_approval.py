"""The executor's approval checks: what you approve is what runs."""

from __future__ import annotations

from control_plane.approvals import hashing
from executor.approval import arguments_sha256, canonical_json, check

ARGS = {"to": "ada@example.com", "amount": 100}
REQUESTED = {"arguments": ARGS, "arguments_sha256": arguments_sha256(ARGS)}


def decided(decision: str, arguments=ARGS, **extra):
    return {
        "decision": decision,
        "arguments": arguments,
        "arguments_sha256": arguments_sha256(arguments),
        "approved_sha256": REQUESTED["arguments_sha256"],
        **extra,
    }


def test_hash_is_canonical_over_key_order():
    assert arguments_sha256({"a": 1, "b": 2}) == arguments_sha256({"b": 2, "a": 1})
    assert arguments_sha256({"a": 1}) != arguments_sha256({"a": 1.5})


def test_an_approval_runs_exactly_the_approved_arguments():
    verdict = check(REQUESTED, decided("approved"))
    assert verdict.arguments == ARGS and verdict.refusal is None


def test_tampered_arguments_are_refused():
    forged = decided("approved", {**ARGS, "amount": 100000})
    verdict = check(REQUESTED, forged)
    assert verdict.arguments is None and verdict.tampered and "hash mismatch" in verdict.refusal
    # Even with a recomputed hash, approved arguments must be the ones requested.
    forged["approved_sha256"] = arguments_sha256(forged["arguments"])
    assert check(REQUESTED, forged).tampered


def test_an_edit_runs_the_humans_arguments_and_says_so():
    edited = {"to": "ada@example.com", "amount": 90}
    verdict = check(REQUESTED, decided("edited", edited, edited_from=ARGS))
    assert verdict.arguments == edited and verdict.edited_from == ARGS


def test_rejections_and_expiry_are_results_not_errors():
    assert check(REQUESTED, decided("rejected", reason="wrong price")).refusal == (
        "rejected: wrong price"
    )
    assert check(REQUESTED, decided("expired", reason="approval expired")).refusal == (
        "rejected: approval expired"
    )


def test_executor_and_control_plane_hash_arguments_identically():
    """The two sides may not share code (gRPC is their only link), so they must agree here."""
    cases = [
        {},
        {"b": 1, "a": [1, 2.5, None, True]},
        {"to": "zoë@example.com", "body": "naïve ✓"},
        {"nested": {"z": {"y": "x"}, "a": []}},
        {"amount": 10**20, "ratio": 0.1},
    ]
    for args in cases:
        assert hashing.canonical_json(args) == canonical_json(args)
        assert hashing.arguments_sha256(args) == arguments_sha256(args)
