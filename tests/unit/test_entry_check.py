"""Every entry checked at once: providers built unwrapped, asked concurrently but bounded, and
the start-up check that logs what would fail and never stops the executor
(docs/decisions/0144-the-preflight-command-and-the-start-up-check.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from services.providers.config import (
    PROVIDER_TYPES,
    ProviderEntry,
    ProviderType,
    build_providers,
    build_unwrapped,
    parse_providers_config,
)
from services.providers.entrycheck import BUG_FIX, check_entries, log_at_start
from services.providers.local import LocalConfig, LocalProvider
from services.providers.preflight import Finding
from services.providers.squidauth.keyed import LeaseKeyed
from services.runtime.settings.errors import ConfigError
from services.testing.provider import FakeConfig, FakeProvider, FakeProviderWithPreflight

SECRET = b"a lease secret of 32 characters!"


def entries(tmp_path: Path, *items: Mapping[str, object]) -> list[ProviderEntry]:
    raw = {"providers": list(items)}
    return parse_providers_config(raw, source="test", base_dir=tmp_path, default_data_dir=tmp_path)


def fake(name: str, **block: object) -> dict[str, object]:
    return {"name": name, "type": "fake", "fake": block}


def test_a_preflight_asks_the_provider_itself_not_its_lease_wrapper(tmp_path: Path) -> None:
    [local] = entries(tmp_path, {"name": "here", "type": "local", "local": {}})
    assert isinstance(build_providers([local], lease_secret=SECRET)["here"], LeaseKeyed)
    assert type(build_unwrapped(local)) is LocalProvider
    [answering, plain] = entries(
        tmp_path, fake("f", preflight={"findings": [{"check": "image", "ok": True}]}), fake("p")
    )
    provider = build_unwrapped(answering)
    assert isinstance(provider, FakeProviderWithPreflight)
    assert provider.findings == [Finding("image", True, "")]
    assert type(build_unwrapped(plain)) is FakeProvider  # nothing to check: no capability


def test_an_entry_that_cannot_be_built_names_its_place_and_the_field(tmp_path: Path) -> None:
    [local] = entries(tmp_path, {"name": "here", "type": "local", "local": {}})
    bad = ProviderEntry("here", "local", LocalConfig(data_dir=""))
    with pytest.raises(ConfigError, match=r"providers\[4\] \(here\): .*local.dataDir is required"):
        build_unwrapped(bad, 4)
    unknown = ProviderEntry("x", "nope", local.config)
    with pytest.raises(ConfigError, match="unknown type 'nope'; use one of"):
        build_unwrapped(unknown)


async def test_entries_are_asked_concurrently_but_at_most_concurrency_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_flight: list[int] = [0]
    most: list[int] = [0]

    class Counting(FakeProviderWithPreflight):
        async def preflight(self) -> list[Finding]:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            for _ in range(5):
                await asyncio.sleep(0)  # every other started entry runs meanwhile
            in_flight[0] -= 1
            return [Finding("credentials", True, self.name)]

    def counting(name: str, _config: FakeConfig) -> FakeProvider:
        return Counting(name)

    monkeypatch.setitem(PROVIDER_TYPES, "counting", ProviderType(lambda: (FakeConfig, counting)))
    items = [{"name": f"c{i}", "type": "counting", "counting": {}} for i in range(7)]
    heard: list[str] = []
    results = await check_entries(
        entries(tmp_path, *items), concurrency=3, on_done=lambda r: heard.append(r.name)
    )
    assert most[0] == 3
    assert [r.name for r in results] == [f"c{i}" for i in range(7)]  # the config's order
    assert [r.findings[0].detail for r in results] == [f"c{i}" for i in range(7)]
    assert sorted(heard) == sorted(r.name for r in results)


async def test_a_config_error_closes_the_providers_built_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[FakeProvider] = []

    def first(name: str, _config: FakeConfig) -> FakeProvider:
        built.append(FakeProvider(name))
        return built[-1]

    def refusing(name: str, _config: FakeConfig) -> FakeProvider:
        raise ConfigError("refusing.token: not set; export REFUSING_TOKEN")

    monkeypatch.setitem(PROVIDER_TYPES, "first", ProviderType(lambda: (FakeConfig, first)))
    monkeypatch.setitem(PROVIDER_TYPES, "refusing", ProviderType(lambda: (FakeConfig, refusing)))
    items = (
        {"name": "a", "type": "first", "first": {}},
        {"name": "b", "type": "refusing", "refusing": {}},
    )
    with pytest.raises(ConfigError, match=r"providers\[1\] \(b\): refusing.token"):
        await check_entries(entries(tmp_path, *items))
    assert [p.closed for p in built] == [True]


async def test_the_start_up_check_logs_each_failing_finding_with_its_fix(tmp_path: Path) -> None:
    failing = {"check": "quota", "ok": False, "detail": "0 of 10 left", "fix": "ask for more"}
    config = entries(
        tmp_path,
        fake("plain"),
        fake("good", preflight={"findings": [{"check": "image", "ok": True}]}),
        fake("bad", preflight={"findings": [{"check": "image", "ok": True}, failing]}),
        fake("down", preflight={"error": "connection refused"}),
    )
    with capture_logs() as logs:
        results = await log_at_start(config)
    assert [(len(r.failed), r.asked) for r in results] == [
        (0, False),
        (0, True),
        (1, True),
        (1, True),
    ]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [(w["provider"], w["check"], w["fix"]) for w in warnings] == [
        ("bad", "quota", "ask for more"),
        ("down", "preflight", "see the detail"),
    ]
    assert warnings[0]["detail"] == "0 of 10 left"
    assert warnings[0]["event"] == "preflight: this provider entry would fail"
    passed = [e for e in logs if e["event"] == "preflight passed"]
    assert [(e["provider"], e["checks"]) for e in passed] == [("good", 1)]  # not the plain one
    [unasked] = [e for e in logs if e["event"] == "no preflight for this provider type"]
    assert (unasked["provider"], unasked["log_level"]) == ("plain", "debug")


async def test_the_start_up_check_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refusing(name: str, _config: FakeConfig) -> FakeProvider:
        raise ConfigError("token: not set")

    def buggy(name: str, _config: FakeConfig) -> FakeProvider:
        return FakeProviderWithPreflight(name, error=KeyError("zones"))

    monkeypatch.setitem(PROVIDER_TYPES, "refusing", ProviderType(lambda: (FakeConfig, refusing)))
    monkeypatch.setitem(PROVIDER_TYPES, "buggy", ProviderType(lambda: (FakeConfig, buggy)))
    with capture_logs() as logs:
        refused = await log_at_start(
            entries(tmp_path, {"name": "r", "type": "refusing", "refusing": {}})
        )
        bugged = await log_at_start(entries(tmp_path, {"name": "b", "type": "buggy", "buggy": {}}))
    assert refused == []
    assert logs[0]["event"] == "preflight could not run"
    assert "token: not set" in logs[0]["error"]
    assert "providers check" in logs[0]["fix"]
    [finding] = bugged[0].findings
    assert (finding.ok, finding.detail, finding.fix) == (False, "KeyError: 'zones'", BUG_FIX)
