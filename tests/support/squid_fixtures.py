"""Fixtures of the tests that run real Squids under the local provider with leases enforced: a
loopback origin to fetch through them (``target``, its URL) and the provider (``local``), whose
proxies are all deleted after the test. A test module imports both by name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.providers.local import LocalProvider
from tests.contract.provider import delete_all
from tests.support.system import hello_target


@pytest.fixture(name="target")
def origin_url() -> Iterator[str]:
    with hello_target() as url:
        yield url


@pytest.fixture(name="local")
async def local_squids(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    provider = LocalProvider("local", tmp_path / "local", backend="squid", stop_grace=0.5)
    yield provider
    await delete_all(provider)
