"""CLI profiles: flag > environment > profile > dev credentials; keys never printed."""

from __future__ import annotations

import json
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_cli import credentials, profiles
from agentrun_cli.main import main
from agentrun_cli.parser import parse

WS_KEY = "agr_ws_0123456789abcdef_" + "A" * 43
PROFILE_KEY = "agr_ws_fedcba9876543210_" + "B" * 43
ENV_KEY = "agr_ws_1111111111111111_" + "C" * 43
DEV_KEY = "agr_ws_2222222222222222_" + "D" * 43


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A config file and dev data dir of the test's own; no AGENTRUN_* from outside."""
    for name in (
        "AGENTRUN_API_KEY",
        "AGENTRUN_ADDRESS",
        "AGENTRUN_WORKSPACE",
        "AGENTRUN_PROFILE",
        "AGENTRUN_TLS_CA",
        "AGENTRUN_TLS_SERVER_NAME",
    ):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "config.toml"
    monkeypatch.setenv("AGENTRUN_CONFIG", str(config))
    data = tmp_path / "data"
    data.mkdir()
    (data / "credentials.json").write_text(json.dumps({"admin_key": DEV_KEY}))
    monkeypatch.setenv("AGENTRUN_DATA_DIR", str(data))
    yield config
    credentials.activate(None)


def write_profile(config: Path, name: str = "prod", **settings: str) -> None:
    profiles.save(profiles.Profile(name=name, **settings), config)


def test_without_profile_the_dev_credentials_and_defaults_apply() -> None:
    args = parse(["runs", "list"])
    assert (args.address, args.workspace) == ("127.0.0.1:50051", "default")
    assert credentials.api_key() == DEV_KEY


def test_profile_fills_address_workspace_and_key(isolated: Path) -> None:
    write_profile(isolated, address="cp.acme:443", workspace="acme", api_key=PROFILE_KEY)
    args = parse(["--profile", "prod", "runs", "list"])
    assert (args.address, args.workspace) == ("cp.acme:443", "acme")
    assert credentials.api_key() == PROFILE_KEY
    # The profile's key is the caller's identity whatever role a command would pick.
    assert credentials.api_key("approver") == PROFILE_KEY


def test_environment_beats_profile(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profile(isolated, address="cp.acme:443", workspace="acme", api_key=PROFILE_KEY)
    monkeypatch.setenv("AGENTRUN_PROFILE", "prod")
    monkeypatch.setenv("AGENTRUN_ADDRESS", "env:1")
    monkeypatch.setenv("AGENTRUN_API_KEY", ENV_KEY)
    args = parse(["runs", "list"])
    assert (args.address, args.workspace) == ("env:1", "acme")
    assert credentials.api_key() == ENV_KEY


def test_flags_beat_environment_and_profile(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_profile(isolated, address="cp.acme:443", workspace="acme")
    monkeypatch.setenv("AGENTRUN_WORKSPACE", "from-env")
    args = parse(["--profile", "prod", "runs", "list", "--address", "flag:2", "--workspace", "w"])
    assert (args.address, args.workspace) == ("flag:2", "w")


def test_a_profile_without_a_key_falls_back_to_the_dev_credentials(isolated: Path) -> None:
    write_profile(isolated, workspace="acme")
    parse(["--profile", "prod", "runs", "list"])
    assert credentials.api_key() == DEV_KEY


def test_default_profile_applies_when_none_is_named(isolated: Path) -> None:
    write_profile(isolated, name="default", address="cp.default:443")
    assert parse(["runs", "list"]).address == "cp.default:443"


def test_key_from_file_and_from_variable(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(PROFILE_KEY + "\n")
    write_profile(isolated, name="file", api_key_file=str(key_file))
    write_profile(isolated, name="var", api_key_env="MY_AGENTRUN_KEY")
    monkeypatch.setenv("MY_AGENTRUN_KEY", ENV_KEY)
    parse(["--profile", "file", "runs", "list"])
    assert credentials.api_key() == PROFILE_KEY
    parse(["--profile", "var", "runs", "list"])
    assert credentials.api_key() == ENV_KEY


def test_unknown_profile_is_an_error_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--profile", "nope", "runs", "list"])
    assert "no profile 'nope'" in capsys.readouterr().err


def test_bad_setting_in_the_file_is_refused(isolated: Path) -> None:
    isolated.write_text('[profile.x]\naddress = "a"\npassword = "p"\n')
    with pytest.raises(profiles.ProfileError, match="unknown setting"):
        profiles.load(isolated)


def test_redact_keeps_only_the_key_id() -> None:
    assert profiles.redact(WS_KEY) == "agr_ws_0123456789abcdef_…"
    assert "A" * 10 not in profiles.redact(WS_KEY)
    assert profiles.redact("eyJhbGciOi.not.akey") == "… (19 characters, not an agentrun key)"
    assert profiles.redact(None) == "-"
    assert repr(profiles.Profile("p", api_key=WS_KEY)).count("A" * 10) == 0


def test_profile_set_writes_0600_and_show_list_redact(
    isolated: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", _Lines(WS_KEY + "\n"))
    assert main(["profile", "set", "ci", "--address", "cp:1", "--api-key-stdin"]) == 0
    assert stat.S_IMODE(isolated.stat().st_mode) == 0o600
    assert profiles.load(isolated)["ci"].key() == WS_KEY
    assert main(["profile", "show", "ci"]) == 0
    assert main(["profile", "list"]) == 0
    assert main(["--json", "profile", "show", "ci"]) == 0
    out = capsys.readouterr().out
    assert WS_KEY not in out and "A" * 10 not in out
    assert out.count("agr_ws_0123456789abcdef_…") == 3


def test_profile_set_changes_only_what_is_given(isolated: Path) -> None:
    assert main(["profile", "set", "p", "--address", "a:1", "--workspace", "w"]) == 0
    assert main(["profile", "set", "p", "--api-key-env", "K"]) == 0
    assert profiles.load(isolated)["p"].settings() == {
        "address": "a:1",
        "workspace": "w",
        "api_key_env": "K",
    }


HAND_WRITTEN = """\
# my agentrun settings: keep this line
editor = "vim"   # not agentrun's, but the file is mine

[profile.prod]
# production: ask Ada before changing
address = "cp.acme:443"  # the load balancer
workspace = "acme"

[profile.staging]
address = "staging:443"   # staging's comment

[aliases]
rl = "runs list"
"""


def test_profile_set_keeps_comments_other_profiles_and_unknown_tables(isolated: Path) -> None:
    isolated.write_text(HAND_WRITTEN)
    assert main(["profile", "set", "prod", "--workspace", "acme2", "--api-key-env", "K"]) == 0
    assert main(["profile", "set", "dev", "--address", "127.0.0.1:50052"]) == 0
    text = isolated.read_text()
    # Every line the user wrote is still there but the one value changed, comments included.
    changed = HAND_WRITTEN.replace('workspace = "acme"', 'workspace = "acme2"')
    kept = [line for line in changed.splitlines() if line]
    assert [line for line in text.splitlines() if line in kept] == kept
    assert 'api_key_env = "K"' in text and "[profile.dev]" in text
    data = tomllib.loads(text)
    assert data["editor"] == "vim" and data["aliases"] == {"rl": "runs list"}
    assert data["profile"]["prod"] == {
        "address": "cp.acme:443",
        "workspace": "acme2",
        "api_key_env": "K",
    }
    assert data["profile"]["staging"] == {"address": "staging:443"}
    assert data["profile"]["dev"] == {"address": "127.0.0.1:50052"}
    # A setting emptied is removed, not left behind.
    assert main(["profile", "set", "prod", "--api-key-env", ""]) == 0
    assert "api_key_env" not in isolated.read_text()
    assert "# production: ask Ada before changing" in isolated.read_text()


class _Lines:
    def __init__(self, text: str) -> None:
        self._text = text

    def readline(self) -> str:
        return self._text


def test_a_value_toml_cannot_hold_is_refused_and_the_file_kept(isolated: Path) -> None:
    write_profile(isolated, address="cp:1")
    before = isolated.read_text()
    with pytest.raises(profiles.ProfileError, match="cannot be saved"):
        write_profile(isolated, name="odd", tls_server_name="\udcff")  # a byte not UTF-8
    assert isolated.read_text() == before and profiles.load(isolated)["prod"].address == "cp:1"


def test_an_argument_that_is_not_utf8_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    """The shell passes bytes; Python reads a non-UTF-8 one as a lone surrogate."""
    with pytest.raises(SystemExit) as exited:
        main(["profile", "set", "x", "--tls-server-name", "\udcff"])
    assert exited.value.code == 2 and "not valid UTF-8" in capsys.readouterr().err
