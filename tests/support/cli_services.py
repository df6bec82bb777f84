"""Services registered only for tests of ``run`` and ``up``: they end by themselves.

The real services run until stopped; these let a test see that a service in the registry is built
with its flags, runs, and can write to the log (the end-to-end tests run the real ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest

from events import subjects
from events.errors import EventStoreError
from events.schemas import HealthChanged
from events.store import NewEvent
from services.cli.run import registry
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import setting


class AppenderSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Flags without variables (``env=None``), so nothing in a test's environment sets them."""

    uid: Annotated[str, setting("The proxy appended to.", env=None)]
    count: Annotated[int, setting("Events to append.", env=None)] = 1
    fail: Annotated[bool, setting("Fail after appending.", env=None, show_default=False)] = False


class RecorderSettings(msgspec.Struct, frozen=True, kw_only=True):
    port: Annotated[int, setting("A port (`up` calls it --api-port).", env=None)] = 1
    providers_config: Annotated[Path | None, setting("A file.", env=None)] = None


@dataclass
class Appender:
    """Appends ``count`` events to one proxy, then ends (or fails): enough to see that a service
    registered in the registry is built with its flags, runs, and can write to the log."""

    uid: str
    count: int
    fail: bool
    name: str = "appender"

    async def run(self, ctx: ServiceContext) -> None:
        batch = [
            NewEvent(HealthChanged(healthy=i % 2 == 0, reason=f"r{i}"), f"{self.uid}-{i}")
            for i in range(self.count)
        ]
        await ctx.store.append(subjects.proxy(self.uid), batch)
        if self.fail:
            raise EventStoreError("appender gave up on purpose")


@dataclass
class Recorder:
    """Records the flags it was built with; ends at once."""

    flags: dict[str, Any]
    name: str = "recorder"

    async def run(self, ctx: ServiceContext) -> None:
        return None


@dataclass
class Registered:
    """What the recorder was built with: one entry per build, its settings and its flags."""

    built: list[dict[str, Any]] = field(default_factory=list)


def register_test_services(monkeypatch: pytest.MonkeyPatch) -> Registered:
    """Only the test services in the registry, for as long as ``monkeypatch`` lasts."""
    record = Registered()
    # Deleted last to first: monkeypatch puts them back in the reverse order of its calls, so the
    # registry's order (the order `up` starts services and the docs list them) comes back as it was.
    for name in reversed(list(registry.SERVICES)):
        monkeypatch.delitem(registry.SERVICES, name)

    def appender(settings: Settings, config: AppenderSettings) -> Appender:
        return Appender(config.uid, config.count, config.fail)

    def recorder(settings: Settings, config: RecorderSettings) -> Recorder:
        flags = msgspec.structs.asdict(config)
        record.built.append({"settings": settings, **flags})
        return Recorder(flags)

    monkeypatch.setitem(
        registry.SERVICES,
        "appender",
        registry.ServiceEntry(
            "appender",
            "Append health events to one proxy.",
            appender,
            AppenderSettings,
        ),
    )
    monkeypatch.setitem(
        registry.SERVICES,
        "recorder",
        registry.ServiceEntry(
            "recorder",
            "Record flags.",
            recorder,
            RecorderSettings,
            up_names={"port": "api_port"},
        ),
    )
    return record
