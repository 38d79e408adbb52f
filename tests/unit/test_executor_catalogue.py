"""The integration catalogue: its entries, least privilege and argument validation."""

from __future__ import annotations

import copy
import json

import pytest

from executor.tools.catalogue import DEFAULT_PATH, Catalogue
from executor.tools.rejection import ToolCallRejected

ALL = ["crm_lookup", "echo", "send_email", "sleep"]


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return Catalogue.load()


def test_the_catalogue_holds_the_sandbox_tools_with_their_classes(catalogue):
    assert {name: t.call_class for name, t in catalogue.tools.items()} == {
        "crm_lookup": "read",
        "crm_upsert": "provider_key",
        "echo": "read",
        "send_email": "lookup",
        "search_email": "read",
        "read_thread": "read",
        "chat_post": "none",
        "create_charge": "provider_key",
        "sleep": "internal",
        "start_child": "internal",
        "start_children": "internal",  # fan-out: several children in one call (issue 45)
        "wait_for_signal": "internal",
        "wait_for_event": "internal",  # events by matching (issue 45)
        "canary_noop": "internal",  # the contract canary's no-op (executor/canary.py)
        "set_metadata": "internal",  # the run records its tags and metadata (issue 45)
        "blob": "read",
        "read_result": "read",
    }
    crm = catalogue.get("crm_lookup")
    assert (crm.method, crm.path, crm.provider) == ("GET", "/crm/contacts", "crm")
    mail = catalogue.get("send_email")
    assert (mail.method, mail.path, mail.kind) == ("POST", "/mail/send", "write")


def test_valid_call_returns_the_tool(catalogue):
    args = {"to": "bob@example.com", "subject": "Hi", "body": "Hello"}
    assert catalogue.check_call("send_email", args, ALL).name == "send_email"


def test_missing_field_is_rejected_naming_it(catalogue):
    with pytest.raises(ToolCallRejected) as err:
        catalogue.check_call("send_email", {"subject": "Hi", "body": "Hello"}, ALL)
    assert "'to'" in str(err.value)
    assert "send_email" in str(err.value)


def test_wrong_type_is_rejected_naming_the_field(catalogue):
    with pytest.raises(ToolCallRejected, match="email"):
        catalogue.check_call("crm_lookup", {"email": 42}, ALL)


def test_extra_argument_is_rejected(catalogue):
    args = {"to": "a@b.c", "subject": "s", "body": "b", "bcc": "evil@x.y"}
    with pytest.raises(ToolCallRejected, match="bcc"):
        catalogue.check_call("send_email", args, ALL)


def test_unknown_tool_is_rejected(catalogue):
    with pytest.raises(ToolCallRejected, match="unknown tool: 'wire_money'"):
        catalogue.check_call("wire_money", {}, ALL)


def test_tool_not_granted_to_the_agent_is_rejected(catalogue):
    with pytest.raises(ToolCallRejected, match="not allowed"):
        catalogue.check_call("send_email", {"to": "a", "subject": "b", "body": "c"}, ["echo"])


def test_arguments_that_were_not_json_are_rejected(catalogue):
    with pytest.raises(ToolCallRejected, match="not valid JSON"):
        catalogue.check_call("echo", None, ALL, arguments_raw="{text: hi")


@pytest.mark.parametrize("seconds", [0, -1, 2_592_001, "10"])
def test_sleep_bounds(catalogue, seconds):
    with pytest.raises(ToolCallRejected, match="seconds"):
        catalogue.check_call("sleep", {"seconds": seconds}, ALL)


def test_sleep_within_bounds(catalogue):
    assert catalogue.check_call("sleep", {"seconds": 2_592_000}, ALL).kind == "internal"
    assert catalogue.check_call("sleep", {"seconds": 0.5}, ALL).kind == "internal"


def test_openai_tools_offers_only_the_agents_tools_in_its_order(catalogue):
    tools = catalogue.openai_tools(["send_email", "crm_lookup", "not_a_tool"])
    assert [t["function"]["name"] for t in tools] == ["send_email", "crm_lookup"]
    assert tools[0]["type"] == "function"
    assert tools[0]["function"]["parameters"]["required"] == ["to", "subject", "body"]
    assert tools[0]["function"]["description"]


def _raw() -> dict:
    return json.loads(DEFAULT_PATH.read_text())


def test_write_without_idempotency_class_is_refused_at_load():
    data = copy.deepcopy(_raw())
    next(t for t in data["tools"] if t["name"] == "send_email")["idempotency"] = None
    with pytest.raises(ValueError, match="idempotency"):
        Catalogue.from_dict(data)


def test_bad_parameters_schema_is_refused_at_load():
    data = copy.deepcopy(_raw())
    data["tools"][0]["parameters"] = {"type": "no-such-type"}
    with pytest.raises(ValueError, match="parameters schema"):
        Catalogue.from_dict(data)


def test_unknown_provider_is_refused_at_load():
    data = copy.deepcopy(_raw())
    data["tools"][0]["provider"] = "nowhere"
    with pytest.raises(ValueError, match="unknown provider"):
        Catalogue.from_dict(data)
