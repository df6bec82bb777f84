"""The executor's meter over access logs written by hand (docs/decisions/0161-metering-upstream-
bytes.md): each line metered once to its lease, through partial lines, rotations, hostile
lines, a lost state, and a kill between the append and the saved offset."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from events import subjects
from events.meter import UpstreamMetered
from events.store import AppendResult, NewEvent
from events.subjects import Aggregate
from services.executor import meter as meter_module
from services.executor.meter import Meter, MeterMetrics, load_state, upstream_providers
from services.providers.instrumented import instrument
from services.providers.local import LocalProvider
from services.providers.local_process import ACCESS_LOG
from services.providers.squidauth.keyed import lease_keyed
from services.providers.upstream.provider import Metered, UpstreamProvider
from services.runtime.eventlog.memory import InMemoryEventStore
from services.runtime.observability.metrics import Metrics

PROVIDER = "resi-de"
LEASE_A = "lease-a"
LEASE_B = "lease-b"


class Killed(BaseException):
    """A kill -9 at this point: nothing after it runs."""


class Entry:
    """An upstream entry with one instance, its log in a directory apart (as when Squid's user
    cannot reach the instance directory)."""

    def __init__(self, root: Path, budget: int = 0) -> None:
        self.name = PROVIDER
        self.max_bytes_per_day = budget
        self.instance = Metered(
            name="de-1",
            instance_uid="uid-de-1",
            proxy_uid="proxy-uid-1",
            instance_dir=root / "instance",
            log_dir=root / "logs",
            pid=0,
        )
        self.instance.instance_dir.mkdir()
        self.instance.log_dir.mkdir()
        self.log = self.instance.log_dir / ACCESS_LOG

    def metered(self) -> list[Metered]:
        return [self.instance]

    def write(self, *lines: bytes, to: Path | None = None) -> None:
        with open(to or self.log, "ab") as file:
            file.write(b"".join(lines))


def line(lease: str, up: int, down: int, result: str = "TCP_MISS") -> bytes:
    return f"1796668038.323 {up} {down} {result} {lease}\n".encode()


class KillAround:
    """A store killed right before or right after an append reaches the inner one."""

    def __init__(self, inner: InMemoryEventStore, *, after: bool) -> None:
        self.inner = inner
        self.after = after

    async def append(
        self, aggregate: Aggregate, events: Sequence[NewEvent], expected_seq: int | None = None
    ) -> AppendResult:
        if not self.after:
            raise Killed
        await self.inner.append(aggregate, events, expected_seq)
        raise Killed


def make_meter(
    store: object, entry: Entry, *, rotate_bytes: int = 1 << 20, clock: float = 1000.0
) -> tuple[Meter, MeterMetrics]:
    metrics = MeterMetrics(CollectorRegistry())
    return (
        Meter(
            store,  # type: ignore[arg-type]  # KillAround has only the append the meter uses
            [entry],
            metrics,
            replica="test",
            rotate_bytes=rotate_bytes,
            clock=lambda: clock,
            signal_squid=lambda _: None,
        ),
        metrics,
    )


async def totals(store: InMemoryEventStore) -> dict[str, tuple[int, int, int]]:
    """Requests, bytes up and down per lease over every record."""
    found: dict[str, tuple[int, int, int]] = {}
    for event in (await store.read(subjects.meter(PROVIDER))).decoded():
        assert isinstance(event, UpstreamMetered)
        assert event.proxy_uid == "proxy-uid-1"
        assert event.provider == PROVIDER
        r, u, d = found.get(event.lease_id, (0, 0, 0))
        found[event.lease_id] = (r + event.requests, u + event.bytes_up, d + event.bytes_down)
    return found


async def test_each_line_is_metered_once_to_its_lease_with_the_budget(tmp_path: Path) -> None:
    entry = Entry(tmp_path, budget=5_000_000)
    store = InMemoryEventStore()
    meter, metrics = make_meter(store, entry)
    entry.write(line(LEASE_A, 100, 1000), line(LEASE_B, 7, 70), line("-", 1, 2))
    assert await meter.meter_once() == 3
    entry.write(line(LEASE_A, 50, 500), b"1796668038.323 9 9 TCP_MI")  # being written
    assert await meter.meter_once() == 1
    assert await meter.meter_once() == 0
    entry.write(b"SS " + LEASE_B.encode() + b"\n")
    assert await meter.meter_once() == 1
    assert await totals(store) == {LEASE_A: (2, 150, 1500), LEASE_B: (2, 16, 79), "": (1, 1, 2)}
    events = (await store.read(subjects.meter(PROVIDER))).decoded()
    assert {e.budget_bytes_per_day for e in events if isinstance(e, UpstreamMetered)} == {5_000_000}
    assert metrics.bytes.labels(PROVIDER, "up")._value.get() == 167


async def test_hostile_lines_are_skipped_and_counted_and_the_rest_metered(tmp_path: Path) -> None:
    entry = Entry(tmp_path)
    store = InMemoryEventStore()
    meter, metrics = make_meter(store, entry)
    entry.write(
        b"\x00\xff garbage\n",
        b"z" * 100_000 + b"\n",
        line("a,b", 1, 1),
        line("-", 5, 5, result="TCP_DENIED"),
        line(LEASE_A, 10, 20),
        b"\n",
    )
    await meter.meter_once()
    assert await totals(store) == {LEASE_A: (1, 10, 20)}
    skipped = {
        reason: metrics.lines.labels(PROVIDER, reason)._value.get()
        for reason in ("garbage", "long", "lease", "denied")
    }
    assert skipped == {"garbage": 1, "long": 1, "lease": 1, "denied": 1}


async def test_a_line_longer_than_a_read_is_skipped_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(meter_module, "READ_MAX", 1024)
    entry = Entry(tmp_path)
    store = InMemoryEventStore()
    meter, metrics = make_meter(store, entry)
    entry.write(b"q" * 5000 + b"\n", line(LEASE_A, 1, 2))
    for _ in range(8):
        await meter.meter_once()
    assert await totals(store) == {LEASE_A: (1, 1, 2)}
    assert metrics.lines.labels(PROVIDER, "long")._value.get() == 1


@pytest.mark.parametrize("after", [False, True], ids=["before the append", "after the append"])
async def test_a_kill_around_the_append_loses_nothing_and_counts_nothing_twice(
    tmp_path: Path, after: bool
) -> None:
    entry = Entry(tmp_path)
    store = InMemoryEventStore()
    entry.write(line(LEASE_A, 100, 1000), line(LEASE_B, 1, 1))
    killed, _ = make_meter(KillAround(store, after=after), entry)
    with pytest.raises(Killed):
        await killed.meter_once()
    assert load_state(entry.instance.instance_dir / meter_module.STATE_FILE).pending > 0
    entry.write(line(LEASE_A, 5, 5))  # written while the executor was down
    restarted, _ = make_meter(store, entry, clock=2000.0)
    await restarted.meter_once()
    await restarted.meter_once()
    assert await totals(store) == {LEASE_A: (2, 105, 1005), LEASE_B: (1, 1, 1)}


async def test_a_rotation_loses_no_line_written_before_squid_reopens(tmp_path: Path) -> None:
    entry = Entry(tmp_path)
    store = InMemoryEventStore()
    rotated = entry.instance.log_dir / meter_module.ROTATED
    signals: list[str] = []

    def reopen(instance: Metered) -> None:
        # Squid, before it takes the signal, writes one more line to the file it has open,
        # then opens a new one.
        signals.append(instance.name)
        entry.write(line(LEASE_A, 3, 30), to=rotated)

    meter, _ = make_meter(store, entry, rotate_bytes=10)
    meter.signal_squid = reopen
    entry.write(line(LEASE_A, 100, 1000))
    await meter.meter_once()
    assert signals == ["de-1"]
    assert rotated.exists()
    assert not entry.log.exists()
    await meter.meter_once()  # Squid has not reopened yet: the rotated file is read, kept
    assert rotated.exists()
    entry.write(line(LEASE_B, 4, 40))  # Squid's new file
    entry.write(line(LEASE_A, 1, 1), to=rotated)  # a last line before it switched
    await meter.meter_once()
    assert not rotated.exists()
    await meter.meter_once()
    assert await totals(store) == {LEASE_A: (3, 104, 1031), LEASE_B: (1, 4, 40)}
    assert load_state(entry.instance.instance_dir / meter_module.STATE_FILE).generation == 2


async def test_a_crash_between_the_new_state_and_removing_the_old_file(tmp_path: Path) -> None:
    """The state already names the new file: the old one, read to its end, is removed unread."""
    entry = Entry(tmp_path)
    store = InMemoryEventStore()
    meter, _ = make_meter(store, entry, rotate_bytes=10)
    entry.write(line(LEASE_A, 100, 1000))
    await meter.meter_once()  # read, then renamed aside
    rotated = entry.instance.log_dir / meter_module.ROTATED
    keep = tmp_path / "kept"
    os.link(rotated, keep)
    entry.write(line(LEASE_B, 4, 40))
    await meter.meter_once()  # drained, moved to the new file, old removed
    os.link(keep, rotated)  # as if the removal never happened
    meter.rotate_bytes = 1 << 20
    await meter.meter_once()
    assert not rotated.exists()
    assert await totals(store) == {LEASE_A: (1, 100, 1000), LEASE_B: (1, 4, 40)}


async def test_a_log_truncated_by_hand_is_read_from_its_start(tmp_path: Path) -> None:
    entry = Entry(tmp_path)
    store = InMemoryEventStore()
    meter, _ = make_meter(store, entry)
    entry.write(line(LEASE_A, 100, 1000), line(LEASE_A, 100, 1000))
    await meter.meter_once()
    os.truncate(entry.log, 0)
    entry.write(line(LEASE_B, 1, 2))
    await meter.meter_once()
    assert await totals(store) == {LEASE_A: (2, 200, 2000), LEASE_B: (1, 1, 2)}


async def test_an_unreadable_state_starts_over_and_an_instance_locked_elsewhere_waits(
    tmp_path: Path,
) -> None:
    entry = Entry(tmp_path)
    store = InMemoryEventStore()
    meter, _ = make_meter(store, entry)
    (entry.instance.instance_dir / meter_module.STATE_FILE).write_bytes(b"\xff{not json")
    entry.write(line(LEASE_A, 1, 1))
    assert await meter.meter_once() == 1
    with meter_module._locked(entry.instance.instance_dir / meter_module.LOCK_FILE) as held:
        assert held
        entry.write(line(LEASE_A, 1, 1))
        assert await meter.meter_once() == 0
    assert await meter.meter_once() == 1


def test_the_upstream_entries_are_found_under_the_lease_key_and_the_instruments() -> None:
    """``build_providers`` wraps an entry that enforces leases (``LeaseKeyed``) and the
    executor instruments every provider: the meter must find the entry under both."""
    entry = object.__new__(UpstreamProvider)  # its attributes play no part here
    entry.name, entry.type = "resi", "upstream"
    other = object.__new__(LocalProvider)
    other.name, other.type = "local", "local"
    keyed = lease_keyed(entry, b"a master secret of enough length")
    wrapped = {
        "resi": instrument(keyed, Metrics()),
        "local": instrument(lease_keyed(other, b"a master secret of enough length"), Metrics()),
    }
    assert upstream_providers(wrapped) == [entry]
    assert upstream_providers({"resi": entry}) == [entry]
    assert upstream_providers({"local": other}) == []
