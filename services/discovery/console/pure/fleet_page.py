"""The fleet page's order, pages and polls: which rows a page shows and what a poll must send.

A fleet of 10,000 proxies is not one table: the page shows ``size`` rows (at most
``MAX_SIZE``) of the filtered fleet, sorted on the server (by name, phase, health, lease,
provider, pool or age; every order ends with namespace, name and uid, so it is total and stable).
A poll of the live page names what it has (``since``: the row cache's instance and version, and
digests of its page's rows in order and of its counts); the answer is "nothing changed", only
the rows changed since plus the counts, or the whole table when the page's rows moved
(docs/console.md, "Fleet pages").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from events.schemas import Phase
from projections import lease_queries
from projections.lease import LeaseView
from services.discovery.console.pure.fleet import HEALTHY, UNHEALTHY, UNKNOWN, FilterError, Row

DEFAULT_SIZE = 100
MIN_SIZE = 10
MAX_SIZE = 200
"""Rows a page may show: 200 keep a poll's whole table under 200 KB."""
MAX_PAGE = 1_000_000
MAX_SINCE = 200
"""A ``since`` longer than this was not made here; it is ignored (the whole table is sent)."""
PAGING = ("sort", "order", "page", "size", "since")
"""The query parameters this module reads; the filters read the rest."""

_PHASE_RANK = {phase.value: i for i, phase in enumerate(Phase)}
_HEALTH_RANK = {UNHEALTHY: 0, UNKNOWN: 1, HEALTHY: 2}
_NEVER = datetime.max.isoformat()


def _name(r: Row) -> tuple[Any, ...]:
    return (r.namespace, r.name, r.uid)


SORTS: dict[str, Callable[[Row], tuple[Any, ...]]] = {
    "name": _name,
    "phase": lambda r: (_PHASE_RANK.get(r.phase, len(_PHASE_RANK)), *_name(r)),
    "health": lambda r: (_HEALTH_RANK.get(r.health, 3), *_name(r)),
    "leased": lambda r: (not r.leased, not r.available, *_name(r)),
    "provider": lambda r: (r.provider, *_name(r)),
    "pool": lambda r: (r.pool == "", r.pool, *_name(r)),
    "age": lambda r: (r.created_at.isoformat() if r.created_at else _NEVER, *_name(r)),
}
"""Each order, ascending: problems first for health, leased first for leases, oldest first for
age."""


@dataclass(frozen=True, slots=True)
class View:
    """How the rows are shown: sorted by ``sort`` (``descending``), page ``page`` of ``size``."""

    sort: str = "name"
    descending: bool = False
    page: int = 1
    size: int = DEFAULT_SIZE
    since: str = ""

    def query(self, **changes: Any) -> list[tuple[str, str]]:
        """The view as query parameters (defaults left out), with ``changes`` applied."""
        sort = changes.get("sort", self.sort)
        descending = changes.get("descending", self.descending)
        page = changes.get("page", self.page)
        size = changes.get("size", self.size)
        out = []
        if sort != "name":
            out.append(("sort", sort))
        if descending:
            out.append(("order", "desc"))
        if page != 1:
            out.append(("page", str(page)))
        if size != DEFAULT_SIZE:
            out.append(("size", str(size)))
        return out

    def sorted_by(self, sort: str) -> list[tuple[str, str]]:
        """A column heading's link: that order, ascending, or reversed if it is the current."""
        return self.query(sort=sort, descending=sort == self.sort and not self.descending, page=1)


def _whole(key: str, text: str, low: int, high: int) -> int:
    value = text.strip()
    if not value.isascii() or not value.isdigit() or not low <= int(value[:12]) <= high:
        raise FilterError(f"{key}: {text[:40]!r} is not a whole number from {low} to {high}")
    return int(value)


def parse_view(query: Iterable[tuple[str, str]]) -> View:
    """``sort``, ``order``, ``page``, ``size`` and ``since`` of the query; the rest is ignored
    here (``fleet.parse_filters`` reads it). Empty values are the defaults."""
    sort, descending, page, size, since = "name", False, 1, DEFAULT_SIZE, ""
    for key, raw in query:
        value = raw.strip()
        if key == "sort" and value:
            if value not in SORTS:
                raise FilterError(f"sort: {value[:40]!r}; sort by one of {', '.join(SORTS)}")
            sort = value
        elif key == "order" and value:
            if value not in ("asc", "desc"):
                raise FilterError(f"order: {value[:40]!r}; use asc or desc")
            descending = value == "desc"
        elif key == "page" and value:
            page = _whole("page", value, 1, MAX_PAGE)
        elif key == "size" and value:
            size = _whole("size", value, MIN_SIZE, MAX_SIZE)
        elif key == "since":
            since = value if len(value) <= MAX_SINCE and value.isascii() else ""
    return View(sort, descending, page, size, since)


@dataclass(frozen=True, slots=True)
class Paged:
    rows: list[Row]
    page: int
    """The page shown: the one asked for, or the last one if the fleet has fewer now."""
    pages: int
    first: int
    """The 1-based position of the page's first row among the rows shown (0: none)."""


def arrange(shown: Sequence[Row], view: View, presorted: bool = False) -> Paged:
    """The page of ``shown`` (sorted by name already when ``presorted``) that ``view`` asks."""
    ordered: Sequence[Row] = shown
    if not presorted or view.sort != "name":
        ordered = sorted(shown, key=SORTS[view.sort])
    if view.descending:
        ordered = ordered[::-1]
    pages = max(1, -(-len(ordered) // view.size))
    page = min(view.page, pages)
    start = (page - 1) * view.size
    rows = list(ordered[start : start + view.size])
    return Paged(rows, page, pages, start + 1 if rows else 0)


def boundary(lease: LeaseView | None, now: datetime) -> datetime | None:
    """The first instant after ``now`` at which the proxy's row changes with no event: its
    lease's end, its cooldown's, a back-off's. None: no such instant."""
    if lease is None:
        return None
    times = [b.until for b in lease.reports.backoffs.values() if b.until > now]
    if lease.current is not None and lease.current.expires_at > now:
        times.append(lease.current.expires_at)
    available = lease_queries.available_at(lease)
    if available is not None and available > now:
        times.append(available)
    return min(times, default=None)


def digest(parts: Iterable[object]) -> str:
    text = "\x1f".join(repr(part) for part in parts)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


@dataclass(frozen=True, slots=True)
class Poll:
    """What a poll names: the row cache it came from, its version, the query it polls
    (``where``: its filters and view) and its page's digests."""

    instance: str
    version: int
    where: str
    order: str
    counts: str

    @property
    def token(self) -> str:
        return f"{self.instance}.{self.version}.{self.where}.{self.order}.{self.counts}"


def where(query: Iterable[tuple[str, str]]) -> str:
    """The digest of a poll's query (filters, order, page, size): a token names the one it was
    made for, so a token carried to another query gets that query's whole table."""
    return digest(query)


def parse_poll(text: str) -> Poll | None:
    """A ``since`` as made by ``Poll.token``; None for anything else (then all is sent)."""
    parts = text.split(".")
    if len(parts) != 5 or not parts[1].isascii() or not parts[1].isdigit():
        return None
    return Poll(parts[0], int(parts[1][:18]), parts[2], parts[3], parts[4])


@dataclass(frozen=True, slots=True)
class Answer:
    """What a poll answers: ``nothing``, ``rows`` (only ``changed`` rows and the counts) or
    ``full`` (the whole table)."""

    mode: str
    changed: list[Row]


def answer(
    before: Poll | None, now: Poll, page: Sequence[Row], versions: Callable[[str], int]
) -> Answer:
    """``versions``: a row's version in the cache (when it last changed). A token of another
    cache, query or page, or one from the future (a version this cache never gave), gets the
    whole table."""
    if (
        before is None
        or before.instance != now.instance
        or before.where != now.where
        or before.order != now.order
        or before.version > now.version
    ):
        return Answer("full", list(page))
    changed = [r for r in page if versions(r.uid) > before.version]
    if not changed and before.counts == now.counts:
        return Answer("nothing", [])
    return Answer("rows", changed)


def one_page(rows: Sequence[Row], view: View | None = None) -> dict[str, Any]:
    """The paging part of the fleet templates' context for ``rows`` already chosen (a page
    rendered without a poll: the time travel's shape, and what the unit tests render)."""
    chosen = view or View()
    return {
        "paged": arrange(rows, chosen, presorted=True),
        "view": chosen,
        "sorts": tuple(SORTS),
        "base": [],
        "poll": None,
    }
