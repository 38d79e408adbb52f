"""The sandbox OAuth server: PKCE code flow, rotating refresh tokens, reuse revocation, and
providers that accept only valid tokens for the right scope."""

import secrets
import warnings
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from sandbox.oauth import CLIENT_ID, CLIENT_SECRET, s256
from sandbox.providers import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

REDIRECT = "http://cp.test/connections/callback"
POST = {"channel": "#general", "text": "hi"}


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app())


def authorize(client: TestClient, scope: str = "chat:write", verifier: str = "v" * 50) -> str:
    answer = client.get(
        "/oauth/chat/authorize",
        params={
            "response_type": "code",
            "client_id": CLIENT_ID,
            "redirect_uri": REDIRECT,
            "scope": scope,
            "state": "st8",
            "code_challenge": s256(verifier),
            "code_challenge_method": "S256",
            "login_hint": "ada@acme",
        },
        follow_redirects=False,
    )
    assert answer.status_code == 302
    query = parse_qs(urlsplit(answer.headers["location"]).query)
    assert query["state"] == ["st8"]
    return query["code"][0]


def token(client: TestClient, **form: str) -> Any:
    form = {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, **form}
    return client.post("/oauth/chat/token", data=form)


def connect(client: TestClient, scope: str = "chat:write") -> dict[str, Any]:
    code = authorize(client, scope)
    answer = token(
        client,
        grant_type="authorization_code",
        code=code,
        code_verifier="v" * 50,
        redirect_uri=REDIRECT,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def post(client: TestClient, access: str | None) -> Any:
    headers = {"Authorization": f"Bearer {access}"} if access else {}
    return client.post("/chat/messages", json=POST, headers=headers)


def stats(client: TestClient) -> dict[str, Any]:
    return client.get("/_sandbox/oauth/stats").json()


def test_code_flow_with_pkce_issues_a_token_the_provider_accepts(client: TestClient) -> None:
    pair = connect(client)
    assert pair["account"] == "ada@acme" and pair["scope"] == "chat:write"
    assert post(client, pair["access_token"]).status_code == 200
    entry = client.get("/_sandbox/requests").json()["requests"][-1]
    assert entry["account"] == "ada@acme" and entry["token_id"].endswith("/1")
    assert pair["access_token"] not in str(entry)


def test_a_wrong_verifier_or_a_reused_code_is_refused(client: TestClient) -> None:
    code = authorize(client)
    wrong = token(
        client,
        grant_type="authorization_code",
        code=code,
        code_verifier="w" * 50,
        redirect_uri=REDIRECT,
    )
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
    again = token(
        client,
        grant_type="authorization_code",
        code=code,
        code_verifier="v" * 50,
        redirect_uri=REDIRECT,
    )
    assert again.status_code == 400  # the code was consumed by the first attempt


def test_plain_pkce_is_refused(client: TestClient) -> None:
    answer = client.get(
        "/oauth/chat/authorize",
        params={
            "response_type": "code",
            "client_id": CLIENT_ID,
            "redirect_uri": REDIRECT,
            "code_challenge": "x",
            "code_challenge_method": "plain",
        },
    )
    assert answer.status_code == 400


def test_refresh_rotates_and_reuse_revokes_the_whole_grant(client: TestClient) -> None:
    first = connect(client)
    second = token(client, grant_type="refresh_token", refresh_token=first["refresh_token"])
    assert second.status_code == 200
    second = second.json()
    assert second["refresh_token"] != first["refresh_token"]
    assert post(client, second["access_token"]).status_code == 200
    reused = token(client, grant_type="refresh_token", refresh_token=first["refresh_token"])
    assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"
    assert stats(client)["reuse_revocations"] == 1
    # Everything of the grant is gone, including the newest pair.
    assert post(client, second["access_token"]).status_code == 401
    newest = token(client, grant_type="refresh_token", refresh_token=second["refresh_token"])
    assert newest.status_code == 400
    assert stats(client)["token_calls"] == 4


def test_expired_unknown_and_revoked_tokens_answer_401(client: TestClient) -> None:
    pair = connect(client)
    assert post(client, secrets.token_urlsafe(32)).status_code == 401
    client.post("/_sandbox/oauth/expire", json={"provider": "chat", "account": "ada@acme"})
    expired = post(client, pair["access_token"])
    assert expired.status_code == 401 and "invalid_token" in expired.headers["www-authenticate"]
    fresh = token(client, grant_type="refresh_token", refresh_token=pair["refresh_token"]).json()
    assert post(client, fresh["access_token"]).status_code == 200
    client.post("/_sandbox/oauth/revoke", json={"provider": "chat", "account": "ada@acme"})
    assert post(client, fresh["access_token"]).status_code == 401


def test_a_removed_scope_answers_403_insufficient_scope(client: TestClient) -> None:
    pair = connect(client)
    client.post(
        "/_sandbox/oauth/scopes",
        json={"provider": "chat", "account": "ada@acme", "scopes": ["chat:read"]},
    )
    answer = post(client, pair["access_token"])
    assert answer.status_code == 403 and "insufficient_scope" in answer.headers["www-authenticate"]
    assert client.get("/_sandbox/effects?provider=chat").json()["effects"] == []


def test_a_token_of_another_provider_is_refused(client: TestClient) -> None:
    pair = connect(client)
    answer = client.get(
        "/crm/contacts",
        params={"email": "a@b.c"},
        headers={"Authorization": f"Bearer {pair['access_token']}"},
    )
    assert answer.status_code == 401


def test_without_authorization_the_default_account_is_served_unless_required(
    client: TestClient,
) -> None:
    assert post(client, None).status_code == 200
    client.post("/_sandbox/oauth/config", json={"require": {"chat": True}})
    assert post(client, None).status_code == 401


def test_a_dropped_refresh_response_still_rotated_the_pair(client: TestClient) -> None:
    pair = connect(client)
    client.post("/_sandbox/oauth/drop_refresh", json={"times": 1})
    with pytest.raises(Exception):  # noqa: B017,PT011 - the connection breaks mid-response
        token(client, grant_type="refresh_token", refresh_token=pair["refresh_token"])
    # The client never saw the new pair; presenting the old token again is reuse.
    again = token(client, grant_type="refresh_token", refresh_token=pair["refresh_token"])
    assert again.status_code == 400
    assert stats(client)["reuse_revocations"] == 1


def test_within_the_reuse_grace_a_lost_rotation_is_answered_again(client: TestClient) -> None:
    client.post("/_sandbox/oauth/config", json={"reuse_grace_seconds": 30})
    pair = connect(client)
    client.post("/_sandbox/oauth/drop_refresh", json={"times": 1})
    with pytest.raises(Exception):  # noqa: B017,PT011 - the connection breaks mid-response
        token(client, grant_type="refresh_token", refresh_token=pair["refresh_token"])
    again = token(client, grant_type="refresh_token", refresh_token=pair["refresh_token"])
    assert again.status_code == 200
    assert stats(client)["reuse_revocations"] == 0
    assert post(client, again.json()["access_token"]).status_code == 200


def revoke(client: TestClient, token: str, **form: str) -> Any:
    form = {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "token": token, **form}
    return client.post("/oauth/chat/revoke", data=form)


def test_rfc7009_revocation_of_a_refresh_token_revokes_the_whole_grant(client: TestClient) -> None:
    pair = connect(client)
    unauthenticated = client.post("/oauth/chat/revoke", data={"token": pair["refresh_token"]})
    assert (
        unauthenticated.status_code == 401 and unauthenticated.json()["error"] == "invalid_client"
    )
    assert post(client, pair["access_token"]).status_code == 200
    assert revoke(client, pair["refresh_token"], token_type_hint="refresh_token").status_code == 200
    assert post(client, pair["access_token"]).status_code == 401
    again = token(client, grant_type="refresh_token", refresh_token=pair["refresh_token"])
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    # An unknown token is no error (§2.2); only the real revocation counts.
    assert revoke(client, secrets.token_urlsafe(32)).status_code == 200
    assert (stats(client)["revoke_calls"], stats(client)["revocations"]) == (3, 1)


def test_a_revocation_the_provider_cannot_serve_answers_503_and_revokes_nothing(
    client: TestClient,
) -> None:
    pair = connect(client)
    client.post("/_sandbox/oauth/config", json={"fail_revocations": 1})
    assert revoke(client, pair["refresh_token"]).status_code == 503
    assert post(client, pair["access_token"]).status_code == 200
    assert revoke(client, pair["refresh_token"]).status_code == 200
    assert post(client, pair["access_token"]).status_code == 401


def test_the_control_endpoints_refuse_malformed_settings_and_keep_theirs(client) -> None:
    """A test's bad setting is a 400 naming it, never a 500 or a half-applied change."""
    before = client.post("/_sandbox/oauth/config", json={}).json()
    for path, body, words in (
        ("/_sandbox/oauth/drop_refresh", {"times": "twice"}, "times"),
        ("/_sandbox/oauth/drop_refresh", {"times": [1]}, "times"),
        ("/_sandbox/oauth/config", {"access_ttl_seconds": "soon"}, "access_ttl_seconds"),
        ("/_sandbox/oauth/config", {"fail_revocations": -1}, "fail_revocations"),
        ("/_sandbox/oauth/config", {"access_ttl_seconds": 5, "require": ["chat"]}, "require"),
    ):
        refused = client.post(path, json=body)
        assert refused.status_code == 400 and words in refused.json()["error"], (path, body)
    assert client.post("/_sandbox/oauth/drop_refresh", json={"times": 2}).json() == {
        "drop_refreshes": 2
    }
    # The refused configs changed nothing, not even the valid access_ttl_seconds beside one.
    assert client.post("/_sandbox/oauth/config", json={}).json() == before
