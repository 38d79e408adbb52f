"""What an executor declares in Hello, and the publish-time checks over declared tool sets."""

from __future__ import annotations

import pytest

from control_plane.ground.errors import InvalidArgument
from control_plane.tools import registry, trifecta
from executor.tools.catalogue import CAPABILITIES, Catalogue
from executor.worker import declarations


def test_hello_declares_every_catalogue_tool_with_its_schema_hash_and_capabilities():
    catalogue = Catalogue.load()
    declared = {d.name: d for d in declarations(catalogue)}
    assert declared.keys() == catalogue.tools.keys()
    assert list(declared["read_thread"].capabilities) == ["reads_private", "reads_untrusted"]
    assert list(declared["send_email"].capabilities) == ["communicates_externally"]
    assert len({d.schema_sha256 for d in declared.values()}) == len(declared)  # schemas differ
    assert all(len(d.schema_sha256) == 64 and d.version for d in declared.values())
    assert {c for d in declared.values() for c in d.capabilities} <= set(CAPABILITIES)


def test_the_control_plane_reads_the_same_catalogue():
    shipped = registry.load_catalogue()
    assert shipped == {n: frozenset(t.capabilities) for n, t in Catalogue.load().tools.items()}


def pool(name: str, *tools: str) -> registry.Pool:
    return registry.Pool(name, {t: frozenset() for t in tools})


@pytest.mark.parametrize(
    ("tools", "pools", "field", "words"),
    [
        (["echo", "nope"], [], "spec.tools[1]", "unknown tool 'nope'"),
        (["nope"], [pool("a", "echo")], "spec.tools[0]", "unknown tool 'nope'"),
        (["send_email"], [pool("a", "echo")], "spec.tools[0]", "no connected executor pool"),
        (["echo", "sleep"], [pool("a", "echo"), pool("b", "sleep")], "spec.tools", "all of"),
    ],
)
def test_sets_the_connected_pools_cannot_run_are_refused(tools, pools, field, words):
    with pytest.raises(InvalidArgument) as info:
        registry.check(tools, pools, registry.load_catalogue())
    assert info.value.field == field and words in str(info.value)


def test_a_pool_declaring_a_tool_the_catalogue_lacks_can_run_it():
    checked = registry.check(["custom"], [pool("a", "custom", "echo")], registry.load_catalogue())
    assert checked.capabilities == {"custom": frozenset()} and checked.warnings == ()


def test_the_trifecta_needs_all_three_legs_and_an_ungated_way_out():
    caps = {
        "inbox": frozenset({"reads_untrusted"}),
        "crm": frozenset({"reads_private"}),
        "mail": frozenset({"communicates_externally"}),
        "chat": frozenset({"communicates_externally"}),
    }
    found = trifecta.warning(caps)
    assert found is not None and found.tools == ("mail", "chat")
    assert trifecta.warning(caps, gated={"mail"}).tools == ("chat",)  # type: ignore[union-attr]
    assert trifecta.warning(caps, gated={"mail", "chat"}) is None
    assert trifecta.warning({k: v for k, v in caps.items() if k != "crm"}) is None
