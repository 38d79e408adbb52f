"""Who may decide approvals: approvers, and signed-in admins (the fallback list); no admin key."""

from __future__ import annotations

import pytest

from control_plane.approvals import decisions
from control_plane.auth.principal import Capability, Kind, Principal
from control_plane.ground.errors import PermissionDenied


def who(kind: Kind, role: str) -> Principal:
    return Principal(kind, "ada@example.com", workspace_id="ws", role=role)


@pytest.mark.parametrize(
    ("kind", "role", "decides"),
    [
        (Kind.KEY, "approver", True),
        (Kind.KEY, "admin", False),  # an admin key is not an approver's credential
        (Kind.KEY, "operator", False),
        (Kind.PERSON, "approver", True),
        (Kind.PERSON, "admin", True),  # a policy naming nobody falls back to the admins
        (Kind.PERSON, "operator", False),
        (Kind.PERSON, "reader", False),
    ],
)
def test_who_holds_the_decide_capability(kind, role, decides):
    assert who(kind, role).may(Capability.DECIDE) is decides


def test_an_admin_key_is_refused_as_a_decider_and_a_signed_in_admin_is_one():
    with pytest.raises(PermissionDenied, match="cannot decide approvals"):
        decisions.Decider.of(who(Kind.KEY, "admin"))
    d = decisions.Decider.of(who(Kind.PERSON, "admin"))
    assert (d.name, d.via, d.role, d.actor) == (
        "ada@example.com",
        decisions.SIGNED_IN,
        "admin",
        "person:ada@example.com",
    )
