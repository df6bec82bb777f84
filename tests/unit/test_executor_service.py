"""Executor start-up: settings are checked and providers come from --providers-config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from services.cli.run import registry
from services.executor.service import ExecutorService, ExecutorSettings, build, consumer_spec
from services.providers.config import ProviderSettings
from services.providers.instrumented import Instrumented
from services.runtime.observability.metrics import Metrics
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import build_settings
from services.testing.provider import FakeProvider


def test_providers_come_from_the_config_file_instrumented(tmp_path: Path) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text(
        "providers:\n"
        "  - name: fake-a\n    type: fake\n    fake: {pendingPolls: 2}\n"
        "  - name: fake-b\n    type: fake\n    fake: {}\n"
    )
    providers = ExecutorService(config, tmp_path).load_providers(Metrics())
    assert sorted(providers) == ["fake-a", "fake-b"]
    wrapped = providers["fake-a"]
    assert isinstance(wrapped, Instrumented)
    assert isinstance(wrapped.inner, FakeProvider)
    assert wrapped.inner.pending_polls == 2


def test_a_bad_config_fails_at_start_up(tmp_path: Path) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text("providers:\n  - name: x\n    type: nope\n    nope: {}\n")
    with pytest.raises(ConfigError, match="use one of"):
        ExecutorService(config, tmp_path).load_providers(Metrics())


@pytest.mark.parametrize(
    ("interval", "timeout", "flag"),
    [(0.0, 600.0, "--observe-interval"), (10.0, -1.0, "--create-timeout")],
)
def test_intervals_must_be_positive(
    tmp_path: Path, interval: float, timeout: float, flag: str
) -> None:
    with pytest.raises(ConfigError, match=flag):
        ExecutorService(None, tmp_path, observe_interval=interval, create_timeout=timeout)


@pytest.mark.parametrize("interval", [0.0, -1.0, 3600.5])
def test_the_meter_interval_is_in_its_bounds(tmp_path: Path, interval: float) -> None:
    with pytest.raises(ConfigError, match="--meter-interval"):
        ExecutorService(None, tmp_path, meter_interval=interval)


def test_create_timeout_reaches_the_policy(tmp_path: Path) -> None:
    assert ExecutorService(None, tmp_path, create_timeout=42.0).policy.create_timeout == 42.0


def test_consumer_survives_long_waits() -> None:
    spec = consumer_spec()
    assert (spec.durable, spec.filter_subjects) == ("executor", ("proxy.*.cmd",))
    assert spec.max_deliver >= 10_000
    assert spec.concurrency == 64


def test_build_checks_the_providers_file_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text("providers: []\n")
    with pytest.raises(ConfigError, match="empty"):
        build(Settings(), ExecutorSettings(providers=ProviderSettings(providers_config=config)))


def test_flags_reach_the_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGRESS_LEASE_SECRET", "a lease secret of 32 characters")  # D84
    flags: dict[str, Any] = {}
    params: list[click.Parameter] = list(registry.SERVICES["executor"].options)
    command = click.Command("executor", params=params, callback=flags.update)
    args = ["--observe-interval", "2.5", "--create-timeout", "60", "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(command, [*args, "--meter-interval", "3"], env={})
    assert result.exit_code == 0, result.output
    service = build(Settings(), build_settings(ExecutorSettings, flags))
    assert (service.observe_interval, service.policy.create_timeout) == (2.5, 60.0)
    assert service.meter_interval == 3.0
    assert (service.providers_config, service.data_dir) == (None, tmp_path.resolve())
    refused = CliRunner().invoke(command, ["--observe-interval", "0"], env={})
    assert refused.exit_code == 2
    assert "--observe-interval" in refused.output
    refused = CliRunner().invoke(command, ["--meter-interval", "3601"], env={})
    assert refused.exit_code == 2
    assert "--meter-interval" in refused.output
