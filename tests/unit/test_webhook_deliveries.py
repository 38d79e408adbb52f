"""From a verified delivery to an event: parsing, dedupe keys, filters, mail loops, push ids."""

from __future__ import annotations

import base64
import json

import pytest

from control_plane.triggers import deliveries, filters, mail
from control_plane.triggers.deliveries import BadDelivery, Settings


def settings(kind="webhook", scheme="stripe", config=None, rules=()) -> Settings:
    return Settings.of(
        {
            "workspace_id": "ws",
            "trigger_id": "t1",
            "agent_id": "triage",
            "kind": kind,
            "scheme": scheme,
            "config": json.dumps(config or {}),
            "filters": json.dumps([r.to_json() for r in rules]),
        }
    )


# --- bodies and dedupe keys --------------------------------------------------------------------


def test_json_and_form_bodies_parse_and_garbage_is_refused():
    assert deliveries.parse_body(b'{"a": 1}', "application/json") == {"a": 1}
    form = deliveries.parse_body(
        b"command=%2Fdeploy&text=&payload=%7B%22type%22%3A%22block_actions%22%7D",
        "application/x-www-form-urlencoded; charset=utf-8",
    )
    assert form == {"command": "/deploy", "text": "", "payload": {"type": "block_actions"}}
    with pytest.raises(BadDelivery, match="body: is not valid JSON"):
        deliveries.parse_body(b"{nope", "application/json")
    with pytest.raises(BadDelivery, match="not UTF-8"):
        deliveries.parse_body(b"\xff\xfe", "application/json")


@pytest.mark.parametrize(
    ("scheme", "headers", "doc", "key"),
    [
        ("stripe", {}, {"id": "evt_1", "type": "invoice.paid"}, "evt_1"),
        ("slack", {}, {"event_id": "Ev01", "type": "event_callback"}, "Ev01"),
        (
            "slack",
            {},
            {"command": "/x", "trigger_id": "13345224609.738474920.8088930838d88f008e0"},
            "13345224609.738474920.8088930838d88f008e0",
        ),
        (
            "github",
            {"x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"},
            {},
            "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        ),
        ("standard_webhooks", {"webhook-id": "msg_p5jX"}, {}, "msg_p5jX"),
        ("hmac_sha256", {"x-webhook-id": "d-9"}, {}, "d-9"),
    ],
)
def test_each_scheme_takes_the_delivery_id_its_sender_keeps_stable(scheme, headers, doc, key):
    assert deliveries.dedupe_key(settings(scheme=scheme), headers, doc) == key


def test_a_named_dedupe_source_replaces_the_schemes():
    s = settings(scheme="github", config={"dedupe_field": "delivery.id"})
    assert (
        deliveries.dedupe_key(s, {"x-github-delivery": "ignored"}, {"delivery": {"id": 7}}) == "7"
    )
    with pytest.raises(BadDelivery, match="expected body field delivery.id"):
        deliveries.dedupe_key(s, {"x-github-delivery": "ignored"}, {})
    s = settings(scheme="hmac_sha256", config={"dedupe_header": "X-Request-Id"})
    assert deliveries.dedupe_key(s, {"x-request-id": "r-1"}, {}) == "r-1"


def test_no_delivery_id_is_a_bad_delivery_naming_where_it_was_looked_for():
    with pytest.raises(BadDelivery, match="expected header x-github-delivery"):
        deliveries.dedupe_key(settings(scheme="github"), {}, {"id": "x"})
    with pytest.raises(BadDelivery, match="body field id"):
        deliveries.dedupe_key(settings(scheme="stripe"), {}, {"id": True})


# --- filters ----------------------------------------------------------------------------------


def rule(field, op, value="", values=(), ignore_case=False):
    return filters.Rule(field, op, value, tuple(values), ignore_case)


def test_filters_pass_or_name_the_first_rule_that_failed():
    doc = {"type": "invoice.paid", "data": {"object": {"amount": 4200, "tags": ["vip"]}}}
    assert filters.first_failure([rule("type", "equals", "invoice.paid")], doc) is None
    assert filters.first_failure([rule("data.object.amount", "in", values=["4200"])], doc) is None
    assert filters.first_failure([rule("data.object.tags.0", "equals", "vip")], doc) is None
    assert filters.first_failure([rule("type", "contains", "PAID", ignore_case=True)], doc) is None
    reason = filters.first_failure(
        [rule("type", "exists"), rule("type", "not_equals", "invoice.paid")], doc
    )
    assert reason == "filters[1]: type not_equals invoice.paid"
    assert filters.first_failure([rule("data.missing", "exists")], doc) == (
        "filters[0]: data.missing exists"
    )
    # A missing field equals nothing and is in no list.
    assert filters.first_failure([rule("nope", "not_in", values=["a"])], doc) is None
    assert filters.first_failure([rule("nope", "equals", "a")], doc) is not None


def test_rules_are_checked_before_they_are_stored():
    assert filters.check(rule("from_address", "not_in", values=["a@b.c"])) is None
    assert "op must be one of" in filters.check(rule("x", "matches", "y"))
    assert filters.check(rule("x", "in")) == "op in needs values"
    assert "dotted path" in filters.check(rule("a..b", "exists"))


def test_a_filtered_webhook_event_carries_its_reason():
    s = settings(rules=[rule("type", "equals", "invoice.paid")])
    event = deliveries.webhook_event(s, {}, {"id": "evt_2", "type": "charge.failed"})
    assert (event.dedupe_key, event.filtered) == ("evt_2", "filters[0]: type equals invoice.paid")
    event = deliveries.webhook_event(s, {}, {"id": "evt_3", "type": "invoice.paid"})
    assert event.filtered is None and '"invoice.paid"' in event.input_text


# --- mail -------------------------------------------------------------------------------------


def message(**overrides):
    doc = {
        "message_id": "<m1@mail.test>",
        "from": "Ada Lovelace <ADA@example.com>",
        "to": ["triage@acme.test"],
        "subject": "Hello",
        "text": "Call me",
        "headers": {},
    }
    return deliveries.parse_mail({**doc, **overrides})


def test_mail_is_deduped_on_its_message_id_and_rendered_for_the_agent():
    m = message()
    event = deliveries.mail_event(settings(kind="mail", scheme="hmac_sha256"), m, m.chain_depth)
    assert event.dedupe_key == "<m1@mail.test>" and event.chain_depth == 0
    assert event.payload["from_address"] == "ada@example.com"
    assert "Subject: Hello" in event.input_text and event.input_text.endswith("Call me")


def test_senders_in_a_list_are_filtered_before_any_run():
    known = rule("from_address", "not_in", values=["ada@example.com", "grace@example.com"])
    s = settings(kind="mail", scheme="hmac_sha256", rules=[known])
    assert deliveries.mail_event(s, message()).filtered == (
        "filters[0]: from_address not_in 2 listed values"
    )
    stranger = message(**{"from": "eve@evil.test"})
    assert deliveries.mail_event(s, stranger).filtered is None


def test_our_marker_past_the_chain_depth_stops_the_loop():
    s = settings(kind="mail", scheme="hmac_sha256", config={"max_chain_depth": 2})
    for depth, stopped in ((1, False), (2, False), (3, True)):
        m = message(headers=mail.outbound_headers(depth - 1))
        assert m.chain_depth == depth
        event = deliveries.mail_event(s, m, m.chain_depth)
        assert event.chain_depth == depth
        assert (event.filtered is not None) == stopped
    deep = message(headers=mail.outbound_headers(2))
    assert deliveries.mail_event(s, deep, deep.chain_depth).filtered == (
        "agent-to-agent loop stopped: chain depth 3 exceeds 2"
    )
    # A depth header without our marker is someone else's: it counts for nothing.
    assert message(headers={"X-Agentrun-Chain-Depth": "9"}).chain_depth == 0
    # Our marker with an unreadable depth is treated as too deep.
    assert (
        message(
            headers={"X-Agentrun-Origin": "agentrun", "X-Agentrun-Chain-Depth": "x"}
        ).chain_depth
        > 2
    )


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ([], "body: must be a JSON object"),
        ({"from": "a@b.c"}, "message_id: is required"),
        ({"message_id": "<x>"}, "from: is required"),
        ({"message_id": "<x>", "from": "a@b.c", "to": [1]}, "to: must be a list"),
        ({"message_id": "<x>", "from": "a@b.c", "headers": {"a": 1}}, "headers: must be"),
    ],
)
def test_malformed_mail_names_the_field(doc, problem):
    with pytest.raises(BadDelivery, match=problem):
        deliveries.parse_mail(doc)


# --- push notifications -----------------------------------------------------------------------


def test_push_history_ids_from_pubsub_envelopes_or_bare_objects():
    data = base64.b64encode(json.dumps({"emailAddress": "a@b.c", "historyId": 9876}).encode())
    envelope = {"message": {"data": data.decode(), "messageId": "2070443601311540"}}
    assert deliveries.push_history_id(envelope) == 9876
    assert deliveries.push_history_id({"historyId": "12"}) == 12
    for bad in ({"historyId": -1}, {"historyId": "x"}, {"message": {"data": "!!"}}, [], {}):
        with pytest.raises(BadDelivery):
            deliveries.push_history_id(bad)
