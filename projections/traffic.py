"""What the gateway relayed over a time range: a fold of ``traffic.*``
(docs/decisions/0158-traffic-records.md).

Totals per client, per proxy, per lease and per target host, summed over the records whose
server timestamp falls in the range (``Scope``) and, when the scope names them, of one client or
one proxy. The server's timestamp is the clock time travel reads by; a record is stored up to
one interval after the traffic it counts.

Pure, and trusting nothing in the log: a record ``events.traffic.problem`` finds fault with
(negative or absurd counts, a host no rule allows, too many rows) is counted in ``unusable`` and
left out whole. Each table keeps at most ``MAX_KEYS`` keys; the rest are summed under ``OTHER``.
The view is mutable, folded in place (``apply`` returns it): a week of records is millions of
rows, and a copy per record would cost more than the sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime

from events.store import Recorded
from events.traffic import OTHER, TrafficRecorded, TrafficRow, problem

MAX_KEYS = 100_000
"""Keys one table of the view holds; a crawl's hosts beyond it are summed under ``OTHER``."""
TABLES = ("clients", "proxies", "leases", "hosts")


@dataclass(slots=True)
class Totals:
    requests: int = 0
    tunnels: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    status_2xx: int = 0
    status_3xx: int = 0
    status_4xx: int = 0
    status_5xx: int = 0
    blocked: int = 0
    failed: int = 0

    def add(self, row: TrafficRow | Totals) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(row, name))

    def frozen(self, host: str) -> TrafficRow:
        """These counts as one host's row of a record (the gateway counts with them too)."""
        return TrafficRow(host=host, **{name: getattr(self, name) for name in self.__slots__})

    @property
    def bytes(self) -> int:
        return self.bytes_up + self.bytes_down


TOTALS = tuple(f.name for f in fields(Totals))


@dataclass(frozen=True, slots=True)
class Scope:
    """Which records count: stored in ``[since, until)``, of ``client``, through ``proxy`` (its
    uid or ``namespace/name``); None: any."""

    since: datetime | None = None
    until: datetime | None = None
    client: str | None = None
    proxy: str | None = None

    def holds(self, recorded: Recorded, event: TrafficRecorded) -> bool:
        at = recorded.timestamp
        return (
            (self.since is None or at >= self.since)
            and (self.until is None or at < self.until)
            and (self.client is None or event.client == self.client)
            and (self.proxy is None or self.proxy in (event.proxy_uid, event.proxy))
        )


@dataclass
class TrafficView:
    scope: Scope = field(default_factory=Scope)
    clients: dict[str, Totals] = field(default_factory=dict)
    proxies: dict[str, Totals] = field(default_factory=dict)
    """By proxy uid."""
    proxy_names: dict[str, str] = field(default_factory=dict)
    """Proxy uid -> ``namespace/name`` as its latest record named it."""
    leases: dict[str, Totals] = field(default_factory=dict)
    hosts: dict[str, Totals] = field(default_factory=dict)
    total: Totals = field(default_factory=Totals)
    records: int = 0
    unusable: int = 0
    last_seq: int = 0


def _add(table: dict[str, Totals], key: str, sums: Totals) -> None:
    if key not in table and len(table) >= MAX_KEYS:
        key = OTHER
    table.setdefault(key, Totals()).add(sums)


def apply(view: TrafficView | None, recorded: Recorded) -> TrafficView:
    event = recorded.event
    if not isinstance(event, TrafficRecorded):
        raise TypeError(f"{type(event).__name__} is no traffic event")
    view = view if view is not None else TrafficView()
    view.last_seq = recorded.seq
    if problem(event) is not None:
        view.unusable += 1
        return view
    if not view.scope.holds(recorded, event):
        return view
    sums = Totals()
    for row in event.rows:
        sums.add(row)
        _add(view.hosts, row.host, _of(row))
    view.records += 1
    view.total.add(sums)
    _add(view.clients, event.client, sums)
    _add(view.proxies, event.proxy_uid, sums)
    _add(view.leases, event.lease_id, sums)
    known = event.proxy_uid in view.proxy_names or len(view.proxy_names) < MAX_KEYS
    if event.proxy and known:
        view.proxy_names[event.proxy_uid] = event.proxy
    return view


def _of(row: TrafficRow) -> Totals:
    sums = Totals()
    sums.add(row)
    return sums


def fold(records: list[Recorded], scope: Scope | None = None) -> TrafficView:
    view = TrafficView(scope=scope or Scope())
    for recorded in records:
        view = apply(view, recorded)
    return view


def table(view: TrafficView, by: str) -> list[tuple[str, Totals]]:
    """One of ``TABLES``, busiest (by bytes) first."""
    if by not in TABLES:
        raise ValueError(f"by {by!r}: one of {', '.join(TABLES)}")
    rows: dict[str, Totals] = getattr(view, by)
    return sorted(rows.items(), key=lambda item: (-item[1].bytes, -item[1].requests, item[0]))
