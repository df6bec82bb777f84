"""Counting what the gateway relays, bounded, into traffic records
(docs/decisions/0158-traffic-records.md).

``Counts`` sums one interval's exchanges per (client, proxy, lease) and target host, and turns
them into ``TrafficRecorded`` events; ``Backlog`` keeps the records a flush could not append,
for the next flush to append again under the same message ids (the stream drops a repeat within
its duplicate window, so a record is never counted twice).

Everything is bounded, because a crawl touches endless hosts and a hostile crawler can invent
them: at most ``MAX_RECORDS`` (client, proxy, lease) keys per interval, then one overflow key
per client (proxy and lease ``OTHER``) for at most ``MAX_OVERFLOW`` clients, then exchanges are
dropped and counted; at most ``MAX_HOSTS`` hosts per key and ``MAX_HOST_ROWS`` in all, then a
host's counts join the key's ``OTHER`` row. The backlog holds at most ``MAX_PENDING`` records,
none older than ``MAX_PENDING_AGE``. Pure: the clock is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from events.store import NewEvent, derive_msg_id
from events.traffic import (
    MAX_ROWS,
    OTHER,
    TrafficRecorded,
    TrafficRow,
    client_key,
    host_problem,
    name_problem,
)
from projections.traffic import Totals

MAX_RECORDS = 1000
"""(client, proxy, lease) keys counted apart per interval: the records one flush appends, with
the overflow keys below."""
MAX_OVERFLOW = 100
"""Clients whose exchanges beyond ``MAX_RECORDS`` are summed under proxy and lease ``OTHER``."""
MAX_HOSTS = 256
"""Hosts counted apart per key while an interval lasts; the record names the busiest
``events.traffic.MAX_ROWS`` of them."""
MAX_HOST_ROWS = 50_000
"""Hosts counted apart per interval over every key."""
MAX_PENDING = 20_000
"""Records kept for a later flush when the log cannot take them."""
MAX_PENDING_AGE = 300.0
"""Seconds a kept record may wait: half the stream's duplicate window (600 s), so that an
append retried after a failure that did store it is still recognised as a repeat."""

MAX_PROXY = 253
"""A proxy's ``namespace/name`` as a record holds it, at most."""

Key = tuple[str, str, str]
"""(client, proxy uid, lease id)."""


@dataclass(slots=True)
class _Record:
    proxy: str
    hosts: dict[str, Totals] = field(default_factory=dict)


@dataclass(slots=True)
class Exchange:
    """One request or tunnel, as the gateway saw it end. Not frozen, though nothing changes
    it: one is made per request, and a frozen dataclass takes ten times as long to make."""

    client: str
    proxy_uid: str
    proxy: str
    lease_id: str
    host: str
    outcome: str
    """``success``, ``blocked`` or ``failed`` (``services.gateway.pure.outcomes``)."""
    status: int = 0
    """The answer's status (0: none); a failed exchange counts as failed, not by its status."""
    up: int = 0
    down: int = 0
    tunnel: bool = False


def host_key(host: str) -> str:
    """The host a row is kept under: lower case, ASCII (IDNA), without a trailing dot; ``OTHER``
    for a host no rule allows (the record must be one the codec writes)."""
    name = host.strip().lower().removesuffix(".")
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            return OTHER
    return OTHER if host_problem(name) is not None else name


def _name(text: str) -> str:
    """A client label (an open gateway's is whatever the user name began with), proxy uid or
    lease id as a record may hold it; ``OTHER`` for one it may not."""
    return OTHER if name_problem(text) is not None else text


def _count(row: Totals, exchange: Exchange) -> None:
    """Field by field: this runs once per request on the gateway's hot path."""
    row.requests += 1
    row.bytes_up += exchange.up
    row.bytes_down += exchange.down
    if exchange.tunnel:
        row.tunnels += 1
    status = exchange.status
    if exchange.outcome == "failed":
        row.failed += 1
    elif 200 <= status < 300:
        row.status_2xx += 1
    elif 300 <= status < 400:
        row.status_3xx += 1
    elif 400 <= status < 500:
        row.status_4xx += 1
    elif 500 <= status < 600:
        row.status_5xx += 1
    if exchange.outcome == "blocked":
        row.blocked += 1


@dataclass
class Counts:
    """One interval's exchanges, bounded (the module's docstring)."""

    records: dict[Key, _Record] = field(default_factory=dict)
    host_rows: int = 0
    overflow: int = 0
    dropped: int = 0
    """Exchanges not counted this interval: beyond every bound."""

    def add(self, exchange: Exchange) -> None:
        # A key or host already kept is in its kept form: the raw one is looked up first, and
        # only a new one is checked and normalised.
        key = (exchange.client, exchange.proxy_uid, exchange.lease_id)
        record = self.records.get(key)
        if record is None:
            key = (_name(key[0]), _name(key[1]), _name(key[2]))
            record = self.records.get(key)
        if record is None:
            if len(self.records) - self.overflow >= MAX_RECORDS:
                key = (key[0], OTHER, OTHER)
                record = self.records.get(key)
                if record is None:
                    if self.overflow >= MAX_OVERFLOW:
                        self.dropped += 1
                        return
                    self.overflow += 1
            if record is None:
                proxy = exchange.proxy if key[1] != OTHER else ""
                if len(proxy) > MAX_PROXY or not proxy.isprintable():
                    proxy = ""  # a name the record may not hold: the uid still says which
                record = self.records[key] = _Record(proxy)
        host = exchange.host
        row = record.hosts.get(host)
        if row is None:
            host = host_key(host)
            row = record.hosts.get(host)
        if row is None:
            if host != OTHER and (
                len(record.hosts) >= MAX_HOSTS or self.host_rows >= MAX_HOST_ROWS
            ):
                host = OTHER
                row = record.hosts.get(OTHER)
            if row is None:
                row = record.hosts[host] = Totals()
                self.host_rows += 1
        _count(row, exchange)

    def empty(self) -> bool:
        return not self.records and not self.dropped

    def take(self, *, replica: str, start: datetime, interval: float) -> list[tuple[str, NewEvent]]:
        """The interval's records, each with its client's subject key and a message id made of
        the replica, the interval and the key (a retried append of it is the same message);
        the counts start again from nothing."""
        out = []
        for (client, proxy_uid, lease_id), record in self.records.items():
            event = TrafficRecorded(
                client=client,
                replica=replica,
                start=start,
                interval_seconds=interval,
                proxy_uid=proxy_uid,
                lease_id=lease_id,
                proxy=record.proxy,
                rows=_rows(record.hosts),
            )
            subject_key = client_key(client)
            msg_id = derive_msg_id(
                "traffic", replica, start.isoformat(), subject_key, proxy_uid, lease_id
            )
            out.append((subject_key, NewEvent(event, msg_id)))
        self.records.clear()
        self.host_rows = self.overflow = self.dropped = 0
        return out


def _rows(hosts: dict[str, Totals]) -> tuple[TrafficRow, ...]:
    """The busiest ``MAX_ROWS`` hosts by bytes (then requests, then name, so the order is the
    same on every replica), and ``OTHER`` summing the rest."""
    named = sorted(
        ((h, r) for h, r in hosts.items() if h != OTHER),
        key=lambda item: (-(item[1].bytes_up + item[1].bytes_down), -item[1].requests, item[0]),
    )
    other = Totals()
    if OTHER in hosts:
        other.add(hosts[OTHER])
    for _, row in named[MAX_ROWS:]:
        other.add(row)
    rows = [row.frozen(host) for host, row in named[:MAX_ROWS]]
    if other.requests:
        rows.append(other.frozen(OTHER))
    return tuple(rows)


@dataclass
class Backlog:
    """Records made and not yet appended, oldest first, by message id; bounded in number and in
    age (the module's docstring)."""

    waiting: OrderedDict[str, tuple[str, NewEvent, float]] = field(default_factory=OrderedDict)
    dropped: int = 0
    """Records given up on since the last ``take_dropped``."""

    def add(self, records: list[tuple[str, NewEvent]], now: float) -> None:
        for subject_key, new in records:
            self.waiting[new.msg_id] = (subject_key, new, now)
        while len(self.waiting) > MAX_PENDING:
            self.waiting.popitem(last=False)
            self.dropped += 1

    def due(self, now: float) -> dict[str, list[NewEvent]]:
        """What to append now, per subject key, oldest first; records too old to be retried
        safely are given up on."""
        for msg_id, (_, _, made) in list(self.waiting.items()):
            if now - made <= MAX_PENDING_AGE:
                break
            del self.waiting[msg_id]
            self.dropped += 1
        found: dict[str, list[NewEvent]] = {}
        for subject_key, new, _ in self.waiting.values():
            found.setdefault(subject_key, []).append(new)
        return found

    def done(self, msg_ids: list[str]) -> None:
        for msg_id in msg_ids:
            self.waiting.pop(msg_id, None)

    def take_dropped(self) -> int:
        dropped, self.dropped = self.dropped, 0
        return dropped

    def __len__(self) -> int:
        return len(self.waiting)
