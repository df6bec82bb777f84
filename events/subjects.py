"""Streams, subjects and aggregates (docs/architecture.md, The event log).

An aggregate is the unit of optimistic concurrency: the set of subjects whose last sequence an
append is checked against. A proxy's aggregate spans ``proxy.<uid>.>`` (all categories), a pool's
``pool.<uid>.>``, a lease's is the single subject ``lease.<proxy-uid>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import get_args

from events.schemas import Event, PoolEvent, ProxyEvent

PROXY_STREAM = "PROXY"
LEASE_STREAM = "LEASE"
GC_STREAM = "GC"
POOL_STREAM = "POOL"
DEMAND_STREAM = "DEMAND"
TRAFFIC_STREAM = "TRAFFIC"
METER_STREAM = "METER"
DEADLETTER_STREAM = "DEADLETTER"

# The subjects of a proxy's stream, one per category its events name, in the union's order.
PROXY_CATEGORIES = tuple(dict.fromkeys(cls.category for cls in get_args(ProxyEvent)))
# The subjects of a pool's aggregate, likewise.
POOL_CATEGORIES = tuple(dict.fromkeys(cls.category for cls in get_args(PoolEvent)))

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")


class InvalidToken(ValueError):
    """A value that cannot be a subject token (dots, wildcards, spaces, empty)."""


def check_token(kind: str, value: str) -> str:
    if not _TOKEN.match(value):
        raise InvalidToken(
            f"{kind} {value!r} cannot be used in a subject: use 1-128 letters, digits, '-' or '_'"
        )
    return value


@dataclass(frozen=True, slots=True)
class Aggregate:
    """Where an aggregate's events live and how its concurrency check is scoped."""

    stream: str
    key: str
    filter_subject: str
    per_category: bool
    categories: tuple[str, ...] = PROXY_CATEGORIES
    """The categories a per-category aggregate's events name (its literal subjects)."""

    def subject_for(self, event: Event) -> str:
        if self.per_category:
            return f"{self.filter_subject[:-2]}.{event.category}"
        return self.filter_subject

    @property
    def literal_subjects(self) -> tuple[str, ...]:
        """The subjects its events are written to: one per category for a proxy, else the one
        subject. Reading each of them costs the server the same whatever the stream's size; the
        wildcard ``filter_subject`` does not (docs/architecture.md, "Reads")."""
        if self.per_category:
            prefix = self.filter_subject[:-2]
            return tuple(f"{prefix}.{category}" for category in self.categories)
        return (self.filter_subject,)

    def __str__(self) -> str:
        return self.filter_subject


def proxy(uid: str) -> Aggregate:
    check_token("proxy uid", uid)
    return Aggregate(PROXY_STREAM, uid, f"proxy.{uid}.>", per_category=True)


def proxy_category(uid: str, category: str) -> Aggregate:
    """One category of a proxy's events, read on its own (one literal subject: the server walks
    that subject's index, not the stream). Only for reading: its appends would not be checked
    against the rest of the proxy."""
    check_token("proxy uid", uid)
    if category not in PROXY_CATEGORIES:
        raise InvalidToken(f"category {category!r} is not a proxy's: use one of {PROXY_CATEGORIES}")
    return Aggregate(PROXY_STREAM, uid, f"proxy.{uid}.{category}", per_category=False)


def pool(uid: str) -> Aggregate:
    check_token("pool uid", uid)
    return Aggregate(
        POOL_STREAM, uid, f"pool.{uid}.>", per_category=True, categories=POOL_CATEGORIES
    )


def demand(pool_uid: str) -> Aggregate:
    """One pool's unserved lease requests, as discovery replicas report them."""
    check_token("pool uid", pool_uid)
    return Aggregate(DEMAND_STREAM, pool_uid, f"demand.{pool_uid}", per_category=False)


def traffic(client_key: str) -> Aggregate:
    """One client's traffic records, from every gateway replica (``client_key``: the client's
    name as a subject token, ``events.traffic`` and ``services.gateway.pure.traffic``)."""
    check_token("client key", client_key)
    return Aggregate(TRAFFIC_STREAM, client_key, f"traffic.{client_key}", per_category=False)


def meter(provider: str) -> Aggregate:
    """The bytes an upstream provider entry's chaining proxies moved (``events.meter``)."""
    check_token("provider", provider)
    return Aggregate(METER_STREAM, provider, f"meter.{provider}", per_category=False)


def lease(proxy_uid: str) -> Aggregate:
    check_token("proxy uid", proxy_uid)
    return Aggregate(LEASE_STREAM, proxy_uid, f"lease.{proxy_uid}", per_category=False)


def gc(provider: str) -> Aggregate:
    check_token("provider name", provider)
    return Aggregate(GC_STREAM, provider, f"gc.{provider}", per_category=False)


def deadletter(consumer: str) -> Aggregate:
    check_token("consumer name", consumer)
    return Aggregate(DEADLETTER_STREAM, consumer, f"deadletter.{consumer}", per_category=False)


def proxy_uid_of(subject: str) -> str:
    """The aggregate key of a ``proxy.<uid>.<category>``, ``pool.<uid>.<category>`` or
    ``lease.<uid>`` subject."""
    parts = subject.split(".")
    if len(parts) < 2:
        raise InvalidToken(f"subject {subject!r} has no aggregate token")
    return parts[1]


def subject_matches(filter_subject: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more trailing tokens."""
    want = filter_subject.split(".")
    have = subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(have) == len(want)
