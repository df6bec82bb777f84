"""Fixtures integration tests share: a real Squid from the local provider and a recording origin
(the health tests), and a registry of test services (the ``run`` and ``up`` tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.provider import delete_all
from tests.support.cli_services import Registered, register_test_services
from tests.support.health import RecordingTarget, Squid, recording_target
from tests.support.markers import starts


@pytest.fixture
@starts("Squid")
async def squid(tmp_path: Path) -> AsyncIterator[Squid]:
    proxy = Squid(tmp_path / "local")
    await proxy.start()
    yield proxy
    await delete_all(proxy.provider)


@pytest.fixture
@starts("an HTTP origin")
async def target() -> AsyncIterator[RecordingTarget]:
    async with recording_target() as origin:
        yield origin


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Registered:
    """Only the test services in the registry (tests/support/cli_services.py): the real ones run
    until stopped, and the tests of ``run`` and ``up`` need commands that end by themselves."""
    return register_test_services(monkeypatch)
