"""Idempotency keys: derived from the step, and resolved as class `none` once expired."""

from __future__ import annotations

import dataclasses

import pytest

from executor.tools import keys
from executor.tools.catalogue import Catalogue
from executor.tools.keys import ResolutionClass, resolution_class

CATALOGUE = Catalogue.load()
HOUR = 3600.0
CHARGE = CATALOGUE.get("create_charge")  # payments: keys kept 24 h
MAIL = CATALOGUE.get("send_email")  # mail: searchable 720 h
UPSERT = CATALOGUE.get("crm_upsert")  # crm: natural key, never expires


def test_the_key_is_the_run_and_the_seq_of_the_started_step():
    assert keys.derive("0b7e-run", 7) == "0b7e-run:7"
    assert keys.derive("r", 7) == keys.derive("r", 7) != keys.derive("r", 9)


@pytest.mark.parametrize(
    ("age_hours", "retention_hours", "expired"),
    [
        (0, 24, False),
        (22.7, 24, False),  # inside the margin
        (22.8, 24, True),  # within 5 % of the end: no longer trusted
        (25, 24, True),
        (10_000, None, False),  # a key that never expires
    ],
)
def test_a_key_expires_a_margin_before_its_provider_forgets_it(age_hours, retention_hours, expired):
    assert keys.expired(age_hours * HOUR, retention_hours) is expired


def test_the_catalogue_copies_each_providers_retention_onto_its_tools():
    assert (CHARGE.key_retention_hours, MAIL.key_retention_hours) == (24, 720)
    assert UPSERT.key_retention_hours is None


@pytest.mark.parametrize("tool", [CHARGE, MAIL])
def test_a_fresh_key_resolves_by_its_recorded_class(tool):
    assert resolution_class(tool, tool.call_class, 60.0) == ResolutionClass(tool.call_class)


@pytest.mark.parametrize("tool", [CHARGE, MAIL])
def test_a_key_past_its_retention_resolves_as_none(tool):
    old = tool.key_retention_hours * HOUR + 1
    resolved = resolution_class(tool, tool.call_class, old)
    assert resolved.name == "none"
    assert f"keeps keys {tool.key_retention_hours:g} h" in resolved.downgraded_because


def test_a_never_expiring_key_resolves_by_class_however_old():
    assert resolution_class(UPSERT, "provider_key", 365 * 24 * HOUR).name == "provider_key"


def test_a_read_has_no_key_to_expire():
    crm = CATALOGUE.get("crm_lookup")
    assert resolution_class(crm, "read", 10**9) == ResolutionClass("read")


def test_a_call_the_catalogue_no_longer_agrees_with_resolves_as_none():
    weaker = dataclasses.replace(CHARGE, idempotency="none")
    resolved = resolution_class(weaker, "provider_key", 1.0)
    assert resolved.name == "none" and "now says class none" in resolved.downgraded_because
    stronger = dataclasses.replace(CATALOGUE.get("chat_post"), idempotency="provider_key")
    assert resolution_class(stronger, "none", 1.0).name == "none"  # sent without a key


def test_a_tool_gone_from_the_catalogue_resolves_as_none():
    resolved = resolution_class(None, "provider_key", 1.0)
    assert resolved == ResolutionClass("none", "the tool is no longer in the catalogue")


def test_internal_tools_resolve_as_internal():
    assert resolution_class(CATALOGUE.get("sleep"), "internal", 10**9).name == "internal"
