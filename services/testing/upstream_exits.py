"""What the fake proxy service (``upstream_server``) keeps: its exits by country, the sessions
holding them, the faults it was told to answer with, and the traffic of each session.

No I/O and no clock of its own (the server passes ``now``), so the rules are unit-tested:

- the first request of a session (a session id in a country) takes a free exit of that country,
  the next one after the last handed out, so a session that comes back after a drop or its
  lifetime's end leaves from another address when the country has one free. Its later requests
  leave from the same exit until its lifetime ends: the service's own (``--session-seconds``),
  shortened to what the login asks (``sesstime``, ``sessionduration``, ``lifetime``);
- a request without a session gets the country's next exit, a free one when there is one: a
  fresh exit per request;
- a country not in the map is refused (400, as the services answer a country they do not serve),
  a country whose exits are all held by sessions is refused 502 ("no peers", Bright Data says);
- ``drop`` forgets a session (its next request takes a new exit), ``move`` gives it another one at
  once, as a service's peer going away does;
- faults (407, 402, 429 with a ``Retry-After``) and stalls are answered to the next N requests,
  or to all until cleared, optionally those of one session only;
- bytes up (towards the site) and down, and requests, are counted per session, kept after it
  ends: what a service bills.

The country map is ``country=address`` specs: ``de=127.0.2.1-127.0.2.50`` (a range),
``fr=127.0.3.1,127.0.3.2`` (a list). Only loopback addresses: the fake binds its upstream
connections to them, and a test must never leave from a real address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

FAULT_STATUSES = (402, 407, 429)
MAX_EXITS = 4096
MAX_REMEMBERED = 100_000
NO_SESSION = ""


class Refused(Exception):
    """The request is answered ``status`` with ``reason`` instead of being relayed."""

    def __init__(self, status: int, reason: str, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


def parse_countries(specs: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``country=range-or-list`` specs as exits by country; a ValueError names the bad one."""
    countries: dict[str, tuple[str, ...]] = {}
    owner: dict[str, str] = {}
    for spec in specs:
        country, sep, addresses = spec.partition("=")
        country = country.strip().lower()
        if not sep or len(country) != 2 or not country.isascii() or not country.isalpha():
            raise ValueError(f"{spec!r}: give country=addresses, e.g. de=127.0.2.1-127.0.2.50")
        if country in countries:
            raise ValueError(f"{spec!r}: the country {country} is given twice")
        found: list[str] = []
        for item in addresses.split(","):
            found += _addresses(item.strip(), spec)
        if not found:
            raise ValueError(f"{spec!r}: no address")
        for address in found:
            if address in owner:
                raise ValueError(f"{spec!r}: {address} is already {owner[address]}'s")
            owner[address] = country
        countries[country] = tuple(found)
    if not countries:
        raise ValueError("give at least one country=addresses")
    if len(owner) > MAX_EXITS:
        raise ValueError(f"more than {MAX_EXITS} exits")
    return countries


def _addresses(item: str, spec: str) -> list[str]:
    first, _, last = item.partition("-")
    try:
        low = ipaddress.IPv4Address(first.strip())
        high = ipaddress.IPv4Address(last.strip()) if last else low
    except ValueError:
        raise ValueError(f"{spec!r}: {item!r} is not an IPv4 address or range") from None
    if not (low.is_loopback and high.is_loopback) or high < low:
        raise ValueError(f"{spec!r}: {item!r} must be loopback addresses (127.x.y.z), low-high")
    if int(high) - int(low) >= MAX_EXITS:
        raise ValueError(f"{spec!r}: {item!r} is more than {MAX_EXITS} addresses")
    return [str(ipaddress.IPv4Address(n)) for n in range(int(low), int(high) + 1)]


@dataclass
class Session:
    session: str
    country: str
    exit: str
    started: float
    expires: float


@dataclass
class Traffic:
    requests: int = 0
    up: int = 0
    down: int = 0


@dataclass
class Fault:
    """``status`` (0: a stall) for ``remaining`` more requests (None: until cleared)."""

    status: int
    remaining: int | None = 1
    retry_after: int | None = None
    session: str | None = None
    """Only this session's requests (None: any request)."""

    def matches(self, session: str) -> bool:
        return self.session is None or self.session == session


@dataclass
class Book:
    countries: dict[str, tuple[str, ...]]
    lifetime: float
    """The longest a session keeps its exit, in seconds."""
    sessions: dict[tuple[str, str], Session] = field(default_factory=dict)
    traffic: dict[tuple[str, str], Traffic] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    stalls: list[Fault] = field(default_factory=list)
    _cursor: dict[str, int] = field(default_factory=dict)
    _last: dict[tuple[str, str], str] = field(default_factory=dict)
    """The exit a session had before it ended: not given to it again while another is free."""

    # ------------------------------------------------------------------ exits

    def exit_for(self, session: str, country: str, now: float, *, asked: int | None = None) -> str:
        """The exit this request leaves from; ``Refused`` when the country has none for it."""
        country = self.country(country)
        if country not in self.countries:
            offered = ", ".join(sorted(self.countries))
            raise Refused(
                400, f"no exits in the country {country!r}: this service offers {offered}"
            )
        self._expire(now)
        if session == NO_SESSION:
            return self._next(country, exclude=frozenset(), free_only=False)
        held = self.sessions.get((session, country))
        if held is not None:
            return held.exit
        before = self._last.pop((session, country), None)
        chosen = self._next(country, exclude=frozenset({before} if before else ()), free_only=True)
        life = min(self.lifetime, float(asked)) if asked else self.lifetime
        self.sessions[(session, country)] = Session(session, country, chosen, now, now + life)
        return chosen

    def country(self, asked: str) -> str:
        """The country a login asks for; without one, the map's first (a service picks)."""
        return asked or next(iter(self.countries))

    def _expire(self, now: float) -> None:
        for key in [k for k, s in self.sessions.items() if s.expires <= now]:
            self._end(key)

    def _end(self, key: tuple[str, str]) -> None:
        self._last[key] = self.sessions.pop(key).exit
        if len(self._last) > MAX_REMEMBERED:
            del self._last[next(iter(self._last))]

    def _held(self) -> set[str]:
        return {s.exit for s in self.sessions.values()}

    def _next(self, country: str, *, exclude: frozenset[str], free_only: bool) -> str:
        """The country's next exit after the last handed out: a free one, not in ``exclude``
        if another is free; else (``free_only`` False) the next in turn."""
        exits = self.countries[country]
        start = self._cursor.get(country, -1) + 1
        held = self._held()
        order = [(start + i) % len(exits) for i in range(len(exits))]
        free = [i for i in order if exits[i] not in held]
        chosen = [i for i in free if exits[i] not in exclude] or free
        if not chosen:
            if free_only:
                raise Refused(502, f"no peers available in {country}: every exit is in a session")
            chosen = order
        self._cursor[country] = chosen[0]
        return exits[chosen[0]]

    def drop(self, session: str) -> int:
        """Forget ``session`` in every country; how many were forgotten."""
        keys = [k for k in self.sessions if k[0] == session]
        for key in keys:
            self._end(key)
        return len(keys)

    def move(self, session: str, now: float) -> list[str]:
        """Give ``session`` another free exit of its country at once; the new exits (empty:
        no such session). ``Refused`` (409) when its country has no other free exit."""
        self._expire(now)
        moved = []
        for (name, country), held in self.sessions.items():
            if name != session:
                continue
            free = [e for e in self.countries[country] if e not in self._held()]
            if not free:
                raise Refused(409, f"no other free exit in {country} to move {session!r} to")
            held.exit = self._next(country, exclude=frozenset({held.exit}), free_only=True)
            moved.append(held.exit)
        return moved

    # ------------------------------------------------------------------ faults

    def add_fault(self, fault: Fault) -> None:
        if fault.status not in FAULT_STATUSES:
            raise ValueError(f"status {fault.status}: a fault is one of {FAULT_STATUSES}")
        self.faults.append(fault)

    def add_stall(self, fault: Fault) -> None:
        self.stalls.append(Fault(0, fault.remaining, None, fault.session))

    def clear(self) -> None:
        self.faults.clear()
        self.stalls.clear()

    def fault_for(self, session: str) -> Fault | None:
        """The fault the next request of ``session`` is answered with, if any (taken)."""
        return _take(self.faults, session)

    def stall_for(self, session: str) -> bool:
        return _take(self.stalls, session) is not None

    # ------------------------------------------------------------------ traffic

    def count(self, session: str, country: str, *, up: int = 0, down: int = 0) -> None:
        traffic = self.traffic.setdefault((session, country), Traffic())
        traffic.up += up
        traffic.down += down

    def count_request(self, session: str, country: str) -> None:
        self.traffic.setdefault((session, country), Traffic()).requests += 1

    def report(self, now: float) -> list[dict[str, object]]:
        """Every session and its traffic, live or not, for the control API."""
        self._expire(now)
        rows: list[dict[str, object]] = []
        for key in sorted(set(self.traffic) | set(self.sessions)):
            traffic = self.traffic.get(key, Traffic())
            held = self.sessions.get(key)
            rows.append(
                {
                    "session": key[0],
                    "country": key[1],
                    "exit": held.exit if held else None,
                    "expiresIn": round(held.expires - now, 3) if held else None,
                    "requests": traffic.requests,
                    "bytesUp": traffic.up,
                    "bytesDown": traffic.down,
                }
            )
        return rows


def _take(faults: list[Fault], session: str) -> Fault | None:
    for fault in faults:
        if fault.matches(session):
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    faults.remove(fault)
            return fault
    return None
