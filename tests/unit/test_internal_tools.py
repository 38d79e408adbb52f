"""The internal tools' one table: which tool starts a call, and which resumes a started one."""

from __future__ import annotations

from executor import internal_tools
from executor.internal_tools import TOOLS, Unsupported, resuming, starting
from executor.tools.catalogue import Catalogue


def test_the_table_holds_every_internal_tool_the_catalogue_ships_and_no_other():
    shipped = {t.name for t in Catalogue.load().tools.values() if t.provider == "internal"}
    assert set(TOOLS) == shipped
    for name, tool in TOOLS.items():
        assert tool.call_class == Catalogue.load().tools[name].call_class


def test_a_call_started_as_internal_resumes_with_the_tool_of_its_name():
    assert resuming("sleep", "internal") is TOOLS["sleep"]
    assert resuming(internal_tools.CHILD_TOOL, "internal") is TOOLS["start_child"]
    assert resuming("read_result", "read") is TOOLS["read_result"]


def test_an_internal_tool_this_executor_lacks_is_refused_at_start_and_settled_on_resume():
    assert isinstance(starting("teleport"), Unsupported)
    assert isinstance(resuming("teleport", "internal"), Unsupported)


def test_a_workspace_tool_named_like_a_built_in_resumes_by_its_own_class():
    """It shadows the built-in for its run (tools/definitions.py) and records its own
    class: resolved like any call, never parked on a child or a signal that never comes."""
    assert resuming("start_child", "none") is None
    assert resuming("wait_for_signal", "provider_key") is None
    assert resuming("sleep", "read") is None
    assert resuming("crm_lookup", "read") is None
