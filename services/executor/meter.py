"""The executor's meter: the bytes through upstream instances' Squids, read from their access
logs and appended as ``UpstreamMetered`` to ``meter.<provider>``
(docs/decisions/0161-metering-upstream-bytes.md).

Per instance, a state file (``meter.json`` in its directory) keeps the log file being read (its
generation and inode), the offset read to, and the range being appended when there is one. A
step reads whole lines from the offset, writes that range into the state (durably), appends one
record per lease with message ids derived from the range, then moves the offset past it. Killed
anywhere, the next step reads the same range again (the range was saved before the append), and
the stream drops what it already has as duplicates: nothing is lost, nothing counted twice.

The log is bounded: once ``rotate_bytes`` of it are read, the meter renames it aside and asks
Squid to reopen it (``SIGUSR1``; Squid's own ``logfile_rotate 0`` renames nothing), reads the
renamed one to its end once Squid writes the new one, then removes it. A lock on the state file
lets several executors sharing a data dir meter each instance once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter

from events import subjects
from events.errors import EventStoreError
from events.meter import UpstreamMetered, problem
from events.store import EventStore, NewEvent
from services.providers import local_process as proc
from services.providers.base import Provider
from services.providers.pure import meterlog
from services.providers.upstream.provider import Metered, UpstreamProvider
from services.runtime.observability.metrics import metric_set

log = structlog.get_logger("egress.executor.meter")

STATE_FILE = "meter.json"
LOCK_FILE = "meter.lock"
ROTATED = proc.ACCESS_LOG + ".1"
READ_MAX = 4 * 1024 * 1024
"""Bytes read from one log per step; a longer backlog is read over the next steps."""


def upstream_providers(providers: Mapping[str, Provider]) -> list[UpstreamProvider]:
    """The ``upstream`` entries among ``providers``, under whatever wraps them (the lease key's
    ``LeaseKeyed``, the instruments): each wrapper keeps the provider it wraps as ``inner``."""
    found = []
    for provider in providers.values():
        inner: object = provider
        for _ in range(8):  # wrappers are a few deep; a loop of them must not hang the start
            if isinstance(inner, UpstreamProvider) or not hasattr(inner, "inner"):
                break
            inner = inner.inner
        if isinstance(inner, UpstreamProvider):
            found.append(inner)
    return found


def default_replica() -> str:
    """This executor, for the records' ``replica`` (never part of a message id: a range read
    again by another process is the same message)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{socket.gethostname()}-{os.getpid()}")[:128]


class Entry(Protocol):
    """What the meter needs of a provider (``UpstreamProvider`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def max_bytes_per_day(self) -> int: ...

    def metered(self) -> list[Metered]: ...


class MeterState(msgspec.Struct, kw_only=True):
    generation: int = 0
    inode: int = 0
    offset: int = 0
    skipping: bool = False
    """Whether the bytes at ``offset`` are the rest of an over-long line (``meterlog.split``)."""
    pending: int = 0
    """The end of the range being appended (0: none): the next step reads exactly it again."""


class MeterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.bytes = Counter(
            "egress_executor_meter_bytes_total",
            "Bytes read from upstream proxies' access logs and appended to the METER stream, "
            "by direction (up: from the crawlers, down: to them)",
            ["provider", "direction"],
            registry=registry,
        )
        self.lines = Counter(
            "egress_executor_meter_lines_skipped_total",
            "Access log lines the meter did not meter, by reason: long, garbage, lease (an id "
            "no credential carries), empty (no bytes: a connection closed before its request), "
            "denied (refused by Squid, never sent to the service), invalid (a record the log "
            "would refuse)",
            ["provider", "reason"],
            registry=registry,
        )
        self.failures = Counter(
            "egress_executor_meter_failures_total",
            "Meter steps of one instance that could not read its log or append its records "
            "(the same range is read again on the next step)",
            ["provider"],
            registry=registry,
        )


def meter_metrics(registry: CollectorRegistry) -> MeterMetrics:
    return metric_set(registry, MeterMetrics)


@dataclass(frozen=True, slots=True)
class _Read:
    path: Path
    final: bool
    """No more will be written to it (renamed aside, and Squid writes the new one)."""


class Meter:
    """Reads every upstream instance's log each ``meter_once``; ``run`` calls it forever."""

    def __init__(
        self,
        store: EventStore,
        providers: Sequence[Entry],
        metrics: MeterMetrics,
        *,
        replica: str,
        rotate_bytes: int = 1024 * 1024,
        clock: Callable[[], float] = time.time,
        signal_squid: Callable[[Metered], None] | None = None,
    ) -> None:
        self.store = store
        self.providers = tuple(providers)
        self.metrics = metrics
        self.replica = replica
        self.rotate_bytes = rotate_bytes
        self.clock = clock
        self.signal_squid = signal_squid or reopen_log
        self.started = clock()

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.meter_once()

    async def meter_once(self) -> int:
        """One step over every instance of every upstream provider; the records appended."""
        now = self.clock()
        start = datetime.fromtimestamp(self.started, UTC)
        interval = max(now - self.started, 0.001)
        self.started = now
        appended = 0
        for provider in self.providers:
            try:
                instances = await asyncio.to_thread(provider.metered)
            except OSError as exc:
                log.warning(
                    "cannot list instances to meter", provider=provider.name, error=str(exc)
                )
                self.metrics.failures.labels(provider.name).inc()
                continue
            for instance in instances:
                step = _Step(self, provider, instance, start, interval)
                try:
                    appended += await step.run()
                except (OSError, EventStoreError) as exc:
                    log.warning(
                        "meter step failed; the same range is read again next time",
                        provider=provider.name,
                        instance=instance.name,
                        error=str(exc),
                    )
                    self.metrics.failures.labels(provider.name).inc()
        return appended


class _Step:
    """One instance's part of a step (see the module docstring)."""

    def __init__(
        self,
        meter: Meter,
        provider: Entry,
        instance: Metered,
        start: datetime,
        interval: float,
    ) -> None:
        self.meter = meter
        self.provider = provider
        self.instance = instance
        self.start = start
        self.interval = interval
        self.state_path = instance.instance_dir / STATE_FILE
        self.current = instance.log_dir / proc.ACCESS_LOG
        self.rotated = instance.log_dir / ROTATED

    async def run(self) -> int:
        with _locked(self.instance.instance_dir / LOCK_FILE) as held:
            if not held:
                return 0  # another executor meters it now
            state = load_state(self.state_path)
            target = self._target(state)
            if target is None:
                return 0
            appended = await self._read(state, target)
            if target.final:
                if state.offset >= _size(target.path):
                    self._drained(state)
            elif state.offset >= self.meter.rotate_bytes and not self.rotated.exists():
                os.rename(self.current, self.rotated)
                self.meter.signal_squid(self.instance)
            return appended

    def _target(self, state: MeterState) -> _Read | None:
        """The file the state reads, starting a new generation when its own is gone."""
        current, rotated = _stat(self.current), _stat(self.rotated)
        if rotated is not None and rotated.st_ino == state.inode:
            return _Read(self.rotated, final=current is not None)
        if current is not None and current.st_ino == state.inode:
            if rotated is not None:
                self.rotated.unlink()  # read to its end before a crash kept it
            if current.st_size < state.offset:
                return self._restart(state, current.st_ino, self.current, final=False)
            return _Read(self.current, final=False)
        if state.pending:
            log.warning(
                "the log a range was appended from is gone; its records may be missing",
                provider=self.provider.name,
                instance=self.instance.name,
            )
        if rotated is not None:
            return self._restart(state, rotated.st_ino, self.rotated, final=current is not None)
        if current is not None:
            return self._restart(state, current.st_ino, self.current, final=False)
        return None

    @staticmethod
    def _restart(state: MeterState, inode: int, path: Path, *, final: bool) -> _Read:
        state.generation += 1
        state.inode, state.offset, state.skipping, state.pending = inode, 0, False, 0
        return _Read(path, final)

    async def _read(self, state: MeterState, target: _Read) -> int:
        first = state.offset
        wanted = state.pending - first if state.pending > first else READ_MAX
        data, size = await asyncio.to_thread(_read_range, target.path, first, wanted)
        at_end = first + len(data) >= size
        chunk = meterlog.split(data, skipping=state.skipping, final=target.final and at_end)
        end = first + chunk.used
        if end == first:
            return 0
        counted = meterlog.tally(chunk.lines)
        source = meterlog.Source(
            provider=self.provider.name,
            instance_uid=self.instance.instance_uid,
            proxy_uid=self.instance.proxy_uid,
            generation=state.generation,
            budget_bytes_per_day=self.provider.max_bytes_per_day,
        )
        made = meterlog.records(
            source,
            counted,
            first=first,
            end=end,
            replica=self.meter.replica,
            start=self.start,
            interval=self.interval,
        )
        usable = [
            new
            for new in made
            if isinstance(new.event, UpstreamMetered) and problem(new.event) is None
        ]
        if usable:
            state.pending = end
            save_state(self.state_path, state)
            await self.meter.store.append(subjects.meter(self.provider.name), usable)
        state.offset, state.skipping, state.pending = end, chunk.skipping, 0
        save_state(self.state_path, state)
        self._count(counted, len(made) - len(usable), usable)
        return len(usable)

    def _count(self, counted: meterlog.Tally, invalid: int, usable: list[NewEvent]) -> None:
        metrics, name = self.meter.metrics, self.provider.name
        for reason, count in counted.skipped.items():
            metrics.lines.labels(name, reason).inc(count)
        if counted.denied:
            metrics.lines.labels(name, "denied").inc(counted.denied)
        if invalid:
            log.error("meter records the log would refuse", provider=name, count=invalid)
            metrics.lines.labels(name, "invalid").inc(invalid)
        for new in usable:
            if isinstance(new.event, UpstreamMetered):
                metrics.bytes.labels(name, "up").inc(new.event.bytes_up)
                metrics.bytes.labels(name, "down").inc(new.event.bytes_down)

    def _drained(self, state: MeterState) -> None:
        """The renamed log is read to its end and Squid writes the new one: the state moves
        to the new one first, then the old goes (a crash between leaves it to ``_target``)."""
        current = _stat(self.current)
        if current is None:
            return
        state.generation += 1
        state.inode, state.offset, state.skipping, state.pending = current.st_ino, 0, False, 0
        save_state(self.state_path, state)
        self.rotated.unlink(missing_ok=True)


def reopen_log(instance: Metered) -> None:
    """Ask the instance's Squid to reopen its access log; a Squid that is gone opens a new one
    when it starts again."""
    if instance.pid and proc.is_running(instance.pid, instance.instance_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(instance.pid, signal.SIGUSR1)


def load_state(path: Path) -> MeterState:
    """The saved state; a missing or unreadable one starts over from the log's first byte
    (D161, "Limits": what was metered of it before is metered again)."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=MeterState)
    except FileNotFoundError:
        return MeterState()
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("unreadable meter state, starting over", path=str(path), error=str(exc))
        return MeterState()


def save_state(path: Path, state: MeterState) -> None:
    proc.write_atomic(path, msgspec.json.encode(state))


def _read_range(path: Path, first: int, length: int) -> tuple[bytes, int]:
    """At most ``length`` bytes from ``first``, and the file's size then."""
    with open(path, "rb") as file:
        file.seek(first)
        return file.read(length), os.fstat(file.fileno()).st_size


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def _size(path: Path) -> int:
    found = _stat(path)
    return found.st_size if found is not None else 0


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
