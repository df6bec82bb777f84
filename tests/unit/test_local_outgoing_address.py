"""The local provider's ``outgoingAddress``: the Squid line it becomes, and the mistakes refused
when the config is loaded or the provider built, before any proxy could fail every request."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.providers import local_process
from services.providers.base import Permanent
from services.providers.config import build_providers, load_providers_config
from services.providers.local import LocalConfig, LocalProvider
from services.providers.pure.squidconf import outgoing_address, squid_config
from services.runtime.settings.errors import ConfigError


def conf(outgoing: str = "") -> str:
    return squid_config(
        listen="127.0.0.1:20001", name="n", cache_log="/c.log", coredump_dir="/d", outgoing=outgoing
    )


def write(tmp_path: Path, local: str) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(f"providers: [{{name: l, type: local, local: {local}}}]\n")
    return path


# ------------------------------------------------------------------------ squid config


def test_squid_connects_to_targets_from_the_configured_address() -> None:
    # The whole line: no ACL after the address, so it applies to every request.
    assert "tcp_outgoing_address 127.0.0.2" in conf("127.0.0.2").splitlines()


def test_an_ipv6_address_is_written_in_its_canonical_form_without_brackets() -> None:
    assert "tcp_outgoing_address 2001:db8::10\n" in conf("2001:DB8:0:0::10")


def test_without_an_address_the_config_is_unchanged() -> None:
    text = conf()
    assert "tcp_outgoing_address" not in text
    assert conf("") == text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("eth0", "is not an IP address"),
        ("proxy.example", "is not an IP address"),
        ("[2001:db8::1]", "is not an IP address"),
        ("10.0.0.0/8", "is not an IP address"),
        ("127.0.0.2\nhttp_access allow all", "is not an IP address"),
        ("127.0.0.02", "is not an IP address"),
        ("fe80::1%eth0", "has a scope"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "not a unicast address"),
        ("255.255.255.255", "not a unicast address"),
    ],
)
def test_only_an_address_a_host_can_send_from_is_accepted(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        outgoing_address(text)
    with pytest.raises(ValueError, match=problem):
        conf(text)


# ------------------------------------------------------------------------ config


def test_the_camel_case_key_is_read_and_defaults_to_unchanged(tmp_path: Path) -> None:
    [entry] = load_providers_config(
        write(tmp_path, "{outgoingAddress: 127.0.0.3}"), default_data_dir=tmp_path
    )
    assert isinstance(entry.config, LocalConfig)
    assert entry.config.outgoing_address == "127.0.0.3"
    assert LocalConfig().outgoing_address == ""


@pytest.mark.parametrize(
    ("local", "expected"),
    [
        (
            "{outgoingAddress: eth0}",
            r"providers\[0\] \(l\): local: outgoingAddress 'eth0' is not an IP address; use an "
            r"IPv4 or IPv6 literal",
        ),
        ("{outgoingAddress: 127}", r"\(l\): local\.outgoingAddress: Expected `str`, got `int`"),
        (
            "{outgoingAddress: 127.0.0.2, backend: proxypy}",
            r"\(l\): local: outgoingAddress needs the squid backend: .*use backend squid",
        ),
    ],
)
def test_a_wrong_address_is_refused_when_the_config_is_loaded(
    tmp_path: Path, local: str, expected: str
) -> None:
    path = write(tmp_path, local)
    with pytest.raises(ConfigError, match=expected) as caught:
        load_providers_config(path, default_data_dir=tmp_path)
    assert str(path) in str(caught.value)


def test_backend_auto_without_squid_refuses_the_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = load_providers_config(
        write(tmp_path, "{outgoingAddress: 127.0.0.2}"), default_data_dir=tmp_path
    )
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda cmd: None if cmd == "squid" else real(cmd))
    with pytest.raises(
        ConfigError,
        match=r"providers\[0\] \(l\): .*backend auto chose proxypy \(no squid on PATH\): "
        r"outgoingAddress needs the squid backend",
    ):
        build_providers(entries)


def test_an_address_this_host_does_not_have_is_refused_at_start_up(tmp_path: Path) -> None:
    # 192.0.2.0/24 is documentation space (RFC 5737): no host is configured with it.
    entries = load_providers_config(
        write(tmp_path, "{outgoingAddress: 192.0.2.77}"), default_data_dir=tmp_path
    )
    with pytest.raises(
        ConfigError, match=r"local\.outgoingAddress 192\.0\.2\.77 cannot be a source address"
    ):
        build_providers(entries)


def test_the_provider_writes_the_address_into_each_instances_squid_config(tmp_path: Path) -> None:
    entries = load_providers_config(
        write(tmp_path, "{outgoingAddress: 127.0.0.3}"), default_data_dir=tmp_path
    )
    provider = build_providers(entries)["l"]
    assert isinstance(provider, LocalProvider)
    assert provider.outgoing == "127.0.0.3"
    local_process.prepare(local_process.SQUID, tmp_path, 20001, "px", outgoing=provider.outgoing)
    assert "tcp_outgoing_address 127.0.0.3" in (tmp_path / "squid.conf").read_text().splitlines()


def test_an_instance_recorded_under_proxypy_is_not_spawned_without_its_address(
    tmp_path: Path,
) -> None:
    with pytest.raises(Permanent, match="delete the instance so it is re-created with Squid"):
        local_process.prepare(local_process.PROXYPY, tmp_path, 20001, "px", outgoing="127.0.0.2")
