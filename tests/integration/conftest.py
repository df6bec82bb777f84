"""Fixtures the health tests share: a real Squid from the local provider, a recording origin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.provider import delete_all
from tests.support.health import RecordingTarget, Squid, recording_target


@pytest.fixture
async def squid(tmp_path: Path) -> AsyncIterator[Squid]:
    proxy = Squid(tmp_path / "local")
    await proxy.start()
    yield proxy
    await delete_all(proxy.provider)


@pytest.fixture
async def target() -> AsyncIterator[RecordingTarget]:
    async with recording_target() as origin:
        yield origin
