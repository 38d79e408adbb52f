"""The catalogue's declarations: every field on every tool, and what is refused at load."""

from __future__ import annotations

import copy
import json

import pytest

from executor.tools.catalogue import DEFAULT_PATH, PATH_VARIABLE, Catalogue

CATALOGUE = Catalogue.load()


def raw() -> dict:
    return copy.deepcopy(json.loads(DEFAULT_PATH.read_text()))


def test_every_tool_declares_its_provider_bucket_scopes_money_and_approval():
    for tool in CATALOGUE.tools.values():
        assert tool.provider in CATALOGUE.key_retention_hours
        assert tool.kind in ("read", "write", "internal")
        assert isinstance(tool.scopes, tuple) and isinstance(tool.moves_money, bool)
        assert isinstance(tool.needs_approval, bool)
        if tool.provider != "internal":  # the executor's own tools call no provider
            assert tool.rate_bucket, tool.name
        if tool.kind == "write":
            assert tool.scopes, f"{tool.name}: a write names the OAuth scopes it needs"


def test_writes_have_a_class_reads_do_not():
    for tool in CATALOGUE.tools.values():
        if tool.kind == "write":
            assert tool.idempotency in ("provider_key", "lookup", "none"), tool.name
        else:
            assert tool.idempotency is None, tool.name


def test_money_moving_tools_need_approval_by_default():
    movers = [t for t in CATALOGUE.tools.values() if t.moves_money]
    assert [t.name for t in movers] == ["create_charge"]
    assert all(t.needs_approval for t in movers)


def test_the_lookup_class_write_says_how_to_stamp_and_find_its_key():
    lookup = CATALOGUE.get("send_email").lookup
    assert (lookup.body_field, lookup.header_name) == ("headers", "X-Agentrun-Key")
    assert lookup.query_for("r:4") == {"header": "X-Agentrun-Key", "value": "r:4"}
    assert lookup.matches == "messages" and lookup.settle_seconds == 1.0


def test_a_lookup_class_without_a_lookup_spec_is_refused():
    data = raw()
    next(t for t in data["tools"] if t["name"] == "send_email")["lookup"] = None
    with pytest.raises(ValueError, match="lookup spec"):
        Catalogue.from_dict(data)


def test_a_lookup_spec_on_another_class_is_refused():
    data = raw()
    mail = next(t for t in data["tools"] if t["name"] == "send_email")
    chat = next(t for t in data["tools"] if t["name"] == "chat_post")
    chat["lookup"] = mail["lookup"]
    with pytest.raises(ValueError, match="chat_post"):
        Catalogue.from_dict(data)


def test_a_read_with_an_idempotency_class_is_refused():
    data = raw()
    next(t for t in data["tools"] if t["name"] == "echo")["idempotency"] = "none"
    with pytest.raises(ValueError, match="only writes"):
        Catalogue.from_dict(data)


def test_a_malformed_lookup_spec_is_refused():
    data = raw()
    next(t for t in data["tools"] if t["name"] == "send_email")["lookup"]["method"] = "POST"
    with pytest.raises(ValueError, match="send_email"):
        Catalogue.from_dict(data)


def test_an_operator_catalogue_is_loaded_from_the_environment(tmp_path, monkeypatch):
    data = raw()
    data["providers"]["payments"]["key_retention_hours"] = 1
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv(PATH_VARIABLE, str(path))
    assert Catalogue.load().get("create_charge").key_retention_hours == 1
    assert Catalogue.load(DEFAULT_PATH).get("create_charge").key_retention_hours == 24
