"""``--nats-url`` / ``NATS_URL`` as a comma-separated list of a cluster's servers: what is
accepted, how a bad item is named (never with its password), and whom a list logs in as."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.runtime.nats.connection import credentials_for, is_local
from services.runtime.nats.credentials import write_private
from services.runtime.nats.registry import announce
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import (
    Settings,
    check_nats_urls,
    redact_url,
    split_urls,
    url_has_credentials,
)
from tests.support.clirun import run_parsed

CLUSTER = "nats://10.0.0.1:4222,nats://10.0.0.2:4222,nats://10.0.0.3:4222"


def test_a_cluster_list_is_accepted_and_split() -> None:
    settings = Settings.from_options(nats_url=CLUSTER)
    assert settings.nats_url == CLUSTER
    assert settings.nats_urls == CLUSTER.split(",")


def test_spaces_around_the_items_are_ignored() -> None:
    settings = Settings.from_options(nats_url=" nats://a:4222 , nats://b:4222 ")
    assert settings.nats_urls == ["nats://a:4222", "nats://b:4222"]


def test_one_url_is_a_list_of_one() -> None:
    assert Settings.from_options(nats_url="nats://n1:4222").nats_urls == ["nats://n1:4222"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "is empty"),
        ("  ", "is empty"),
        ("nats://a:4222,", "empty item"),
        (",nats://a:4222", "empty item"),
        ("nats://a:4222,,nats://b:4222", "empty item"),
        ("nats://a:4222, ,nats://b:4222", "empty item"),
        ("nats://a:4222,http://b:4222", "'http://b:4222' in the list is not a NATS URL"),
        ("nats://a:4222,b:4222", "'b:4222' in the list is not a NATS URL"),
        ("nats://a:4222,nats://", "'nats://' in the list is not a NATS URL"),
        ("nats://a:4222,nats://b:99999", "'nats://b:99999' in the list is not a NATS URL"),
        ("nats://a:4222,nats://[::1", "'<unparsable URL>' in the list is not a NATS URL"),
        ("nats://a:4222,nats://A:4222", "same server twice"),
        ("nats://a,nats://a:4222", "same server twice"),
        ("nats://a:4222,tls://b:4222", "mix the schemes nats, tls"),
        ("nats://a:4222,ws://b:8080", "mix the schemes nats, ws"),
    ],
)
def test_a_bad_list_names_the_bad_item_and_the_fix(value: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_options(nats_url=value)
    text = str(info.value)
    assert "--nats-url / NATS_URL" in text
    assert says in text
    assert "use" in text or "list each" in text or "separate" in text


def test_a_password_in_a_bad_item_is_not_shown() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_options(nats_url="nats://u:good@a:4222,http://u:hunter2@b:4222")
    assert "hunter2" not in str(info.value)
    assert "good" not in str(info.value)
    assert "'http://u:***@b:4222'" in str(info.value)


def test_a_password_in_an_empty_item_list_is_not_shown() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_options(nats_url="nats://u:hunter2@a:4222,,nats://u:hunter2@b:4222")
    assert "hunter2" not in str(info.value)


def test_a_user_in_one_url_only_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_options(nats_url="nats://u:hunter2@a:4222,nats://b:4222")
    assert "in every URL, or in none" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_a_user_in_every_url_is_accepted_but_not_with_nats_user() -> None:
    both = "nats://u:p1@a:4222,nats://u:p2@b:4222"
    assert Settings.from_options(nats_url=both).nats_urls == both.split(",")
    assert url_has_credentials(both)
    with pytest.raises(ConfigError, match="NATS_USER is set too"):
        Settings.from_options(nats_url=both, nats_user="x", nats_password="y")


def test_each_url_of_a_list_is_redacted() -> None:
    shown = redact_url("nats://a:pw1@h1:4222, nats://h2:4222,nats://tok@h3:4222")
    assert shown == "nats://a:***@h1:4222,nats://h2:4222,nats://***@h3:4222"
    assert redact_url("nats://a:pw@h1:4222,,") == "nats://a:***@h1:4222,,"


def test_split_is_lenient_and_check_is_strict() -> None:
    assert split_urls(" nats://a:1 ,, nats://b:2,") == ["nats://a:1", "nats://b:2"]
    assert check_nats_urls("nats://a:1,nats://b:2") == ["nats://a:1", "nats://b:2"]


def test_the_cli_refuses_a_bad_list_as_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    result, settings = run_parsed(
        ["run", "reconciler"], {"NATS_URL": "nats://a:4222,,nats://b:4222"}, monkeypatch
    )
    assert result.exit_code == 2, result.output
    assert settings is None
    assert "empty item" in result.output


def test_the_cli_takes_a_list_from_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    result, settings = run_parsed(["run", "reconciler", "--nats-url", CLUSTER], {}, monkeypatch)
    assert result.exit_code == 0, result.output
    assert settings is not None
    assert settings.nats_urls == CLUSTER.split(",")


# ------------------------------------------------------------------ local credentials (D65)


@pytest.fixture
def local_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Three local servers sharing one users file, announced on ports 14222-14224 (not bound:
    only the announcements are read)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "nowhere"))
    users = {"admin": "admin-pw", "executor": "executor-pw"}
    credentials = tmp_path / "credentials.json"
    write_private(credentials, json.dumps({"users": users}))
    for port in (14222, 14223, 14224):
        announce(port, credentials)
    return users


def test_a_local_list_finds_the_credentials_of_its_servers(local_cluster: dict[str, str]) -> None:
    url = "nats://127.0.0.1:14222,nats://localhost:14223,nats://[::1]:14224"
    assert is_local(url)
    found = credentials_for(url, user="executor")
    assert found is not None
    assert (found.user, found.password) == ("executor", local_cluster["executor"])


def test_a_list_whose_first_server_has_no_announcement_uses_the_next(
    local_cluster: dict[str, str],
) -> None:
    found = credentials_for("nats://127.0.0.1:15999,nats://127.0.0.1:14223")
    assert found is not None
    assert found.password == local_cluster["admin"]


def test_local_credentials_never_go_to_a_list_with_a_remote_server(
    local_cluster: dict[str, str],
) -> None:
    del local_cluster
    mixed = "nats://127.0.0.1:14222,nats://10.0.0.2:14223"
    assert not is_local(mixed)
    assert credentials_for(mixed) is None


def test_urls_with_users_keep_their_own_credentials(local_cluster: dict[str, str]) -> None:
    del local_cluster
    assert credentials_for("nats://u:p@127.0.0.1:14222,nats://u:p@127.0.0.1:14223") is None
