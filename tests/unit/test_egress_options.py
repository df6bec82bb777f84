"""The health service's ``--egress-*`` flags fail at start-up, naming the flag and the fix,
before anything runs (docs/decisions/0111-verified-egress.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.health.egress_options import EgressFlags, egress_settings
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.spec import build_settings


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"egress_echo_url": "ftp://echo/"}, "--egress-echo-url"),
        ({"egress_echo_url": "not a url"}, "--egress-echo-url"),
        ({"provider_egress_echo_url": ("local",)}, "--provider-egress-echo-url"),
        ({"provider_egress_echo_url": ("=http://x/",)}, "--provider-egress-echo-url"),
        ({"provider_egress_echo_url": ("local=gopher://x/",)}, "--provider-egress-echo-url"),
        ({"egress_country_attribute": "a b"}, "--egress-country-attribute"),
        ({"egress_country_attribute": "-x"}, "--egress-country-attribute"),
    ],
)
def test_a_flag_that_cannot_work_is_refused_by_name(flags: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as info:
        egress_settings(build_settings(EgressFlags, flags))
    assert named in str(info.value)


@pytest.mark.parametrize("content", [b"", b"not a database\n", b"\x00" * 4096])
def test_a_geoip_file_that_is_no_database_is_refused_at_start(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "GeoLite2-Country.mmdb"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        egress_settings(EgressFlags(geoip_db=(path,)))
    assert "--geoip-db" in str(info.value)
    assert str(path) in str(info.value)


def test_interval_zero_turns_the_checks_off_and_the_defaults_check() -> None:
    assert egress_settings(EgressFlags(egress_interval=0))[0] is None
    settings, databases = egress_settings(
        EgressFlags(provider_egress_echo_url=("local=http://127.0.0.1:8081/egress",))
    )
    assert settings is not None
    assert databases == ()
    assert settings.provider_echo_urls == {"local": "http://127.0.0.1:8081/egress"}
