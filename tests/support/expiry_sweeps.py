"""The ``sweeps`` fixture of the discovery tests with several replicas: how many expiry sweeps each
replica has finished, so a test waits for a sweep to have run rather than for a guessed time. The
real sweep runs; the count is taken around it. A test module imports ``count_sweeps`` by name."""

from __future__ import annotations

from collections import Counter

import pytest

from services.discovery.leasing.expiry import ExpirySweep


@pytest.fixture(name="sweeps")
def count_sweeps(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """How many expiry sweeps each replica has finished, by the id of its ``ExpirySweep``."""
    finished: Counter[int] = Counter()
    real = ExpirySweep.sweep

    async def counted(self: ExpirySweep) -> int:
        try:
            return await real(self)
        finally:
            finished[id(self)] += 1

    monkeypatch.setattr(ExpirySweep, "sweep", counted)
    return finished
