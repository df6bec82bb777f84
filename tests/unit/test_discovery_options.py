"""Discovery's flags, factory and pure helpers, without servers."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from events.schemas import MAX_COOLDOWN_SECONDS, MAX_LEASE_SECONDS, Phase, ProxySpec
from projections.proxy import ProxyView
from services.cli.flags import options
from services.cli.run.registry import SERVICES
from services.cli.run.up_cmd import UpCommand, up
from services.discovery.http.errors import InvalidRequest
from services.discovery.http.queries import ProxyFilter, parse_proxy_filter
from services.discovery.leasing import leases
from services.discovery.pure.policy import LeasePolicy
from services.discovery.service import (
    DiscoveryService,
    DiscoverySettings,
    build,
    parse_trusted_proxies,
)
from services.discovery.views import Views
from services.runtime.bearer import token_from_env
from services.runtime.eventlog.memory import InMemoryEventStore
from services.runtime.settings.durations import format_duration, seconds_of
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import build_settings


def test_format_duration() -> None:
    assert [format_duration(s) for s in (3600, 300, 30, 0.5, 0, 5400)] == [
        "1h",
        "5m",
        "30s",
        "0.5s",
        "0s",
        "90m",
    ]


def test_seconds_of_names_the_flag() -> None:
    assert seconds_of("--lease-cooldown", "0s") == 0.0
    assert seconds_of("--max-lease-ttl", 90) == 90.0
    with pytest.raises(ConfigError, match=r"^--max-lease-ttl: '1 hour' is not a duration"):
        seconds_of("--max-lease-ttl", "1 hour")
    with pytest.raises(ConfigError, match=r"^--max-lease-ttl: '0s' must be more than 0"):
        seconds_of("--max-lease-ttl", "0s", positive=True)
    with pytest.raises(ConfigError, match=r"^--lease-cooldown: -1 must be 0 or more"):
        seconds_of("--lease-cooldown", -1)


def _parse(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, dict[str, Any]]:
    seen: dict[str, Any] = {}
    command = click.Command(
        "discovery", params=list(options(DiscoverySettings)), callback=seen.update
    )
    result = CliRunner().invoke(command, list(args), env=env)
    return result.exit_code, result.output, seen


def test_flags_parse_durations_into_seconds() -> None:
    code, output, seen = _parse(
        "--max-lease-ttl", "15m", "--lease-cooldown", "2s", "--block-backoff", "1h30m"
    )
    assert code == 0, output
    assert seen == {
        "egress_country_attribute": "",
        "egress_required": False,
        "unique_egress": False,
        "port": 8080,
        "host": "127.0.0.1",
        "clients_file": None,
        "trusted_proxies": "",
        "max_lease_ttl": 900.0,
        "lease_cooldown": 2.0,
        "block_backoff": 5400.0,
    }
    code, _, seen = _parse(env={"MAX_LEASE_TTL": "2h", "LEASE_COOLDOWN": "0s"})
    assert code == 0
    assert (seen["max_lease_ttl"], seen["lease_cooldown"]) == (7200.0, 0.0)
    code, _, seen = _parse()
    assert (seen["max_lease_ttl"], seen["lease_cooldown"], seen["block_backoff"]) == (
        3600.0,
        10.0,
        600.0,
    )
    code, _, seen = _parse(env={"BLOCK_BACKOFF": "0"})
    assert (code, seen["block_backoff"]) == (0, 0.0)


def test_a_bad_duration_flag_is_named() -> None:
    code, output, _ = _parse("--max-lease-ttl", "forever")
    assert code == 2
    assert "Invalid value for '--max-lease-ttl'" in output
    assert "e.g. 30s, 5m, 1h" in output
    code, output, _ = _parse("--max-lease-ttl", "0")
    assert code == 2
    assert "must be more than 0" in output
    code, output, _ = _parse(env={"LEASE_COOLDOWN": "soon"})
    assert code == 2
    assert "'--lease-cooldown'" in output
    code, output, _ = _parse("--block-backoff", "25h")
    assert code == 2
    assert "'--block-backoff'" in output
    assert "longer than the most allowed, 24h" in output


def test_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISCOVERY_TOKEN", raising=False)
    given = {"port": 9000, "host": "0.0.0.0", "max_lease_ttl": 300.0, "lease_cooldown": 3}
    service = build(Settings(), build_settings(DiscoverySettings, given))
    assert (service.port, service.host, service.max_lease_ttl, service.lease_cooldown) == (
        9000,
        "0.0.0.0",
        300.0,
        3.0,
    )
    assert service.token is None
    monkeypatch.setenv("DISCOVERY_TOKEN", " tok ")
    assert build(Settings(), DiscoverySettings()).token == "tok"
    with pytest.raises(ConfigError, match=r"^--lease-cooldown / LEASE_COOLDOWN: expected `float`"):
        build_settings(DiscoverySettings, {"lease_cooldown": "later"})
    with pytest.raises(ConfigError, match=r"^--block-backoff / BLOCK_BACKOFF: .*>= 0"):
        build_settings(DiscoverySettings, {"block_backoff": -1})


def test_token_from_env() -> None:
    assert token_from_env({}) is None
    assert token_from_env({"DISCOVERY_TOKEN": "   "}) is None
    assert token_from_env({"DISCOVERY_TOKEN": "abc"}) == "abc"


def test_registered_for_run_and_up() -> None:
    entry = SERVICES["discovery"]
    assert entry.up_name("port") == "api_port"
    assert entry.factory is build
    params = UpCommand.get_params(up, click.Context(up))
    names = [p.name for p in params]
    assert "api_port" in names
    assert "port" not in names  # fed by --api-port, never shown twice
    assert {"max_lease_ttl", "lease_cooldown", "host"} <= set(names)
    # The gateway's own options, once each; the API's port and clients file are shared with
    # discovery, so the gateway leases from the API `up` runs, with the same clients.
    assert {"gateway_port", "gateway_host", "insecure_open"} <= set(names)
    assert names.count("api_port") == names.count("clients_file") == 1


def test_parse_proxy_filter() -> None:
    assert parse_proxy_filter([]) == ProxyFilter()
    query = [("phase", "ready"), ("healthy", "False"), ("attr.country", "de"), ("attr.a.b", "")]
    assert parse_proxy_filter(query) == ProxyFilter(
        Phase.READY, False, (("country", "de"), ("a.b", ""))
    )
    for bad in (("phase", "Asleep"), ("healthy", "yes"), ("attr.", "x"), ("available", "true")):
        with pytest.raises(InvalidRequest, match=bad[0]):
            parse_proxy_filter([bad])


def test_a_proxy_filter_matches_only_when_every_part_does() -> None:
    proxy = _proxy()
    assert ProxyFilter().matches(proxy)
    assert ProxyFilter(Phase.READY, True, (("country", "de"), ("tier", "gold"))).matches(proxy)
    assert not ProxyFilter(Phase.FAILED).matches(proxy)
    assert not ProxyFilter(healthy=False).matches(proxy)
    assert not ProxyFilter(attributes=(("country", "de"), ("country", "fr"))).matches(proxy)
    assert not ProxyFilter(healthy=True).matches(_proxy(healthy=None))  # not probed: neither
    assert not ProxyFilter(healthy=False).matches(_proxy(healthy=None))


@pytest.mark.parametrize(
    ("requested", "granted"),
    [(None, 300.0), (30.0, 30.0), (600.0, 600.0), (601.0, 600.0), (1e9, 600.0)],
)
def test_a_ttl_above_the_maximum_is_clamped(requested: float | None, granted: float) -> None:
    assert LeasePolicy(max_ttl=600.0).grant_ttl(requested) == granted
    assert LeasePolicy(max_ttl=60.0).grant_ttl(None) == 60.0  # the default never exceeds it


def _proxy(**changes: Any) -> ProxyView:
    values: dict[str, Any] = {
        "uid": "p1",
        "phase": Phase.READY,
        "url": "http://127.0.0.1:3128",
        "spec": ProxySpec(attributes={"country": "de", "tier": "gold"}),
        "healthy": True,
    }
    values.update(changes)
    return ProxyView(**values)


def eligible(proxy: ProxyView, selector: dict[str, str]) -> bool:
    return leases.eligible(Views(None, InMemoryEventStore()), proxy, selector)  # type: ignore[arg-type]


def test_eligible() -> None:
    assert eligible(_proxy(), {})
    assert eligible(_proxy(), {"country": "de", "tier": "gold"})
    assert not eligible(_proxy(healthy=None), {"country": "de"})  # not probed yet
    assert not eligible(_proxy(), {"country": "fr"})
    assert not eligible(_proxy(), {"pool": "a"})
    assert not eligible(_proxy(healthy=False), {})
    assert not eligible(_proxy(phase=Phase.REPLACING), {})
    assert not eligible(_proxy(deleting=True), {})
    assert not eligible(_proxy(url=""), {})


def test_durations_are_bounded_and_the_flag_named() -> None:
    assert seconds_of("--max-lease-ttl", "168h", maximum=MAX_LEASE_SECONDS) == MAX_LEASE_SECONDS
    with pytest.raises(ConfigError, match=r"^--max-lease-ttl: 1000000000000 is longer than .*168h"):
        seconds_of("--max-lease-ttl", 1000000000000, positive=True, maximum=MAX_LEASE_SECONDS)
    with pytest.raises(ConfigError, match=r"^--lease-cooldown: '25h' is longer than .*24h"):
        seconds_of("--lease-cooldown", "25h", maximum=MAX_COOLDOWN_SECONDS)
    with pytest.raises(ConfigError, match=r"^--lease-cooldown: .*not a duration"):
        seconds_of("--lease-cooldown", float("inf"))
    with pytest.raises(ConfigError, match=r"^--max-lease-ttl / MAX_LEASE_TTL: .*<= 604800"):
        build_settings(DiscoverySettings, {"max_lease_ttl": 1e12})
    with pytest.raises(ConfigError, match=r"^--lease-cooldown / LEASE_COOLDOWN: .*<= 86400"):
        build_settings(DiscoverySettings, {"lease_cooldown": 48 * 3600.0})
    # A Struct made in code, unchecked, still fails when the service is built.
    with pytest.raises(ConfigError, match=r"^--max-lease-ttl: "):
        build(Settings(), DiscoverySettings(max_lease_ttl=1e12))


@pytest.mark.parametrize(
    ("args", "env", "flag"),
    [
        (("--max-lease-ttl", "1000000000000"), None, "--max-lease-ttl"),
        (("--max-lease-ttl", "169h"), None, "--max-lease-ttl"),
        ((), {"MAX_LEASE_TTL": "604801"}, "--max-lease-ttl"),
        (("--lease-cooldown", "25h"), None, "--lease-cooldown"),
        (("--lease-cooldown", "1e400"), None, "--lease-cooldown"),
    ],
)
def test_a_flag_out_of_bounds_stops_the_start(
    args: tuple[str, ...], env: dict[str, str] | None, flag: str
) -> None:
    code, output, seen = _parse(*args, env=env)
    assert code == 2
    assert f"Invalid value for '{flag}'" in output
    assert seen == {}


def test_a_service_made_without_the_flags_checks_the_same_bounds() -> None:
    with pytest.raises(ConfigError, match=r"^--max-lease-ttl: "):
        DiscoveryService(max_lease_ttl=1e12).check()
    with pytest.raises(ConfigError, match=r"^--lease-cooldown: "):
        DiscoveryService(lease_cooldown=-1).check()
    DiscoveryService(max_lease_ttl=MAX_LEASE_SECONDS, lease_cooldown=MAX_COOLDOWN_SECONDS).check()


def test_trusted_proxies_are_addresses_or_networks_strictly() -> None:
    assert parse_trusted_proxies("") == ()
    assert [str(n) for n in parse_trusted_proxies("10.0.0.0/8, 192.0.2.7,fd00::/8")] == [
        "10.0.0.0/8",
        "192.0.2.7/32",
        "fd00::/8",
    ]
    for bad in ("*", "10.0.0.1/8", "proxy.internal", "10.0.0.0/33"):
        with pytest.raises(ConfigError, match=r"^--trusted-proxies: "):
            parse_trusted_proxies(bad)
