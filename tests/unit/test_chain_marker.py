"""The chain marker the executor stamps on mail, read back by the control plane's mail trigger."""

from __future__ import annotations

import json

from agentrun.v1 import run_pb2
from control_plane.triggers import mail
from executor.tools import chain
from executor.tools.catalogue import Catalogue

CATALOGUE = Catalogue.load()
MAIL = {"to": "bob@acme.test", "subject": "Re: ping", "body": "pong"}


def input_step(payload: dict) -> run_pb2.Step:
    return run_pb2.Step(seq=0, kind=run_pb2.STEP_KIND_INPUT, payload_json=json.dumps(payload))


def test_both_sides_name_the_same_headers():
    assert (chain.MARKER_HEADER, chain.MARKER_VALUE, chain.DEPTH_HEADER) == (
        mail.MARKER_HEADER,
        mail.MARKER_VALUE,
        mail.DEPTH_HEADER,
    )
    assert chain.headers(2) == mail.outbound_headers(2)


def test_a_runs_depth_comes_from_its_input_step():
    assert chain.run_depth([input_step({"text": "hi"})]) == 0  # StartRun, a session turn
    started_by_mail = input_step({"text": "x", "trigger": {"kind": "mail", "chain_depth": 2}})
    assert chain.run_depth([started_by_mail]) == 2
    assert chain.run_depth([input_step({"trigger": {"chain_depth": "9"}})]) == 0
    assert chain.run_depth([]) == 0


def test_mail_sends_carry_the_marker_one_hop_deeper_and_other_tools_nothing():
    send = CATALOGUE.tools["send_email"]
    stamped = chain.stamp(send, {**MAIL, "headers": {"X-Agentrun-Key": "r:4"}}, 2, "eu-1")
    assert stamped["headers"] == {
        "X-Agentrun-Key": "r:4",
        "X-Agentrun-Origin": "agentrun",
        "X-Agentrun-Chain-Depth": "3",
        "X-Agentrun-Installation": "eu-1",
    }
    received = mail.parse_message(
        {"message_id": "<m@x>", "from": "alice@acme.test", "headers": stamped["headers"]}
    )
    assert received.chain_depth == 3  # read from the message alone
    assert mail.loop_reason(received.chain_depth, 2) is not None
    echo = CATALOGUE.tools["echo"]
    assert chain.stamp(echo, {"text": "hi"}, 2) == {"text": "hi"}
