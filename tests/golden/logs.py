"""The golden logs: stored messages as every version must keep reading them.

``schema-<N>.jsonl`` holds one line per message a build writing schema N stored: its stream,
sequence, subject, JetStream timestamp, headers, and payload bytes (base64), in the order the
streams stored them. A log is committed once, when its schema is released, and never changed:
it stands for the logs running systems keep for their streams' whole retention.

``expected-events.json`` and ``expected-views.json`` say what the current build makes of every
golden log: each message decoded (its current type and fields), and the views the services
fold from them (``views``). They are compared key by key, and keys the build added are allowed
(``mismatches``), so a new field with a default passes and a changed value fails.
``tests/golden/generate.py`` writes a new schema's log and rewrites the expected files; see
tests/golden/README.md for when.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from events import codec, reading
from events.reading import apply_tolerantly
from events.schemas import Event
from events.skips import Skip
from events.store import Recorded, Unreadable
from events.subjects import (
    DEMAND_STREAM,
    LEASE_STREAM,
    POOL_STREAM,
    PROXY_STREAM,
    TRAFFIC_STREAM,
    proxy_uid_of,
)
from projections import lease as lease_fold
from projections import pool as pool_fold
from projections import pool_demand
from projections import proxy as proxy_fold
from projections import traffic as traffic_fold
from services.reconciler.pure import view as reconciler_state

HERE = Path(__file__).resolve().parent
EXPECTED_EVENTS = HERE / "expected-events.json"
EXPECTED_VIEWS = HERE / "expected-views.json"


def log_path(schema: int) -> Path:
    return HERE / f"schema-{schema}.jsonl"


def log_paths() -> list[Path]:
    """Every committed golden log, oldest schema first."""
    return sorted(HERE.glob("schema-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))


@dataclass(frozen=True)
class Message:
    """One stored message, as JetStream keeps it."""

    stream: str
    seq: int
    subject: str
    time: datetime
    headers: dict[str, str]
    payload: bytes

    def line(self) -> str:
        return json.dumps(
            {
                "stream": self.stream,
                "seq": self.seq,
                "subject": self.subject,
                "time": self.time.isoformat().replace("+00:00", "Z"),
                "headers": self.headers,
                "payload": base64.b64encode(self.payload).decode("ascii"),
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, line: str) -> Message:
        obj = json.loads(line)
        return cls(
            stream=obj["stream"],
            seq=obj["seq"],
            subject=obj["subject"],
            time=datetime.fromisoformat(obj["time"].replace("Z", "+00:00")),
            headers=dict(obj["headers"]),
            payload=base64.b64decode(obj["payload"], validate=True),
        )

    def read(self) -> tuple[Recorded, Skip | None]:
        """Through the one reader every service reads with."""
        return reading.recorded(
            self.stream, self.seq, self.subject, self.time, self.payload, self.headers
        )


def load(path: Path) -> list[Message]:
    return [Message.parse(line) for line in path.read_text().splitlines() if line.strip()]


def write(path: Path, messages: Iterable[Message]) -> None:
    path.write_text("".join(m.line() + "\n" for m in messages))


def builtins(value: object) -> Any:
    """JSON's view of a value (times as strings, tuples as lists): what the files hold."""
    return json.loads(msgspec.json.encode(value))


def decoded(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Each message as the current build decodes it (a skip is recorded as such)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        item, skip = m.read()
        entry: dict[str, Any] = {"stream": m.stream, "seq": m.seq}
        if skip is not None or isinstance(item.event, Unreadable):
            entry["skipped"] = skip.fields() if skip is not None else "unreadable"
        else:
            entry["type"] = codec.event_type(item.event)
            entry["event"] = builtins(item.event)
        out.append(entry)
    return out


def views(messages: Iterable[Message]) -> dict[str, Any]:
    """The views services fold from the log, per aggregate: the shared proxy view
    (``projections.proxy``: the CLI, discovery, health, GC, the watcher), the reconciler's own
    state, the lease view (``projections.lease``: discovery, health), the pool view
    (``projections.pool``: the pool controller, the CLI, discovery) and the pool's demand
    (``projections.pool_demand``: the pool controller) and the traffic per client
    (``projections.traffic``: the ``traffic`` command); plus every event a fold
    could not use."""
    folds: dict[str, tuple[str, Callable[[Any, Recorded], Any]]] = {
        PROXY_STREAM: ("proxies", proxy_fold.apply),
        LEASE_STREAM: ("leases", lease_fold.apply),
        POOL_STREAM: ("pools", pool_fold.apply),
        DEMAND_STREAM: ("demand", pool_demand.apply),
        TRAFFIC_STREAM: ("traffic", traffic_fold.apply),
    }
    found: dict[str, dict[str, Any]] = {name: {} for name, _ in folds.values()}
    states: dict[str, reconciler_state.ProxyState] = {}
    skipped: list[dict[str, object]] = []
    for m in messages:
        item, skip = m.read()
        if skip is not None:
            skipped.append(skip.fields())
        if m.stream not in folds:
            continue
        name, apply = folds[m.stream]
        uid = proxy_uid_of(m.subject)
        view, unusable = apply_tolerantly(apply, found[name].get(uid), item, m.stream)
        if view is not None:
            found[name][uid] = view
        if unusable is not None:
            skipped.append(unusable.fields())
        if m.stream == PROXY_STREAM and not isinstance(item.event, Unreadable):
            # The reconciler's own state; aggregate reads leave unreadable events out.
            states[uid] = reconciler_state.fold(uid, [item], states.get(uid))
    out = {
        name: {uid: builtins(v) for uid, v in sorted(views.items())}
        for name, views in found.items()
    }
    out["reconciler"] = {uid: builtins(s) for uid, s in sorted(states.items())}
    return {**out, "skipped": skipped}


def mismatches(expected: Any, actual: Any, path: str = "$") -> Iterator[str]:
    """Where ``actual`` differs from ``expected``: every key of an expected object must be there
    with an equal value (an actual object may have more), lists match item by item."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            yield f"{path}: expected an object, got {actual!r}"
            return
        for key, value in expected.items():
            if key not in actual:
                yield f"{path}.{key}: missing (was {value!r})"
            else:
                yield from mismatches(value, actual[key], f"{path}.{key}")
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            yield f"{path}: expected {expected!r}, got {actual!r}"
            return
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            yield from mismatches(e, a, f"{path}[{i}]")
    elif expected != actual or isinstance(expected, bool) != isinstance(actual, bool):
        yield f"{path}: expected {expected!r}, got {actual!r}"


def current_types(messages: Iterable[Message]) -> set[str]:
    """The types of ``messages`` as the current build decodes them."""
    found = set()
    for m in messages:
        item, _ = m.read()
        if isinstance(item.event, Event):
            found.add(codec.event_type(item.event))
    return found
