"""The event registry, the proxy categories and the streams are derived from the tagged union;
these tests hold everything else to it, so the first drift fails here rather than as events
every reader skips as ``unknown_type``."""

from __future__ import annotations

import importlib
import pkgutil
from typing import get_args

import events
from events import subjects
from events.base import Event
from events.schemas import (
    EVENT_TYPES,
    AnyEvent,
    DeadLettered,
    DemandEvent,
    GcEvent,
    LeaseEvent,
    MeterEvent,
    PoolEvent,
    ProxyEvent,
    TrafficEvent,
)


def _defined_events() -> set[type[Event]]:
    """Every concrete event class the events package defines, found by walking the package."""
    for module in pkgutil.iter_modules(events.__path__):
        importlib.import_module(f"events.{module.name}")
    found: set[type[Event]] = set()
    todo = list(Event.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith("events."):
            found.add(cls)
    return found


def test_every_event_class_is_in_the_union() -> None:
    assert _defined_events() == set(EVENT_TYPES.values())


def test_the_registry_is_the_union_with_one_name_per_type() -> None:
    members = get_args(AnyEvent)
    assert list(EVENT_TYPES.values()) == list(members)
    assert len(EVENT_TYPES) == len(members)  # no two classes share a name


def test_the_families_partition_the_union() -> None:
    families = [
        *get_args(ProxyEvent),
        *get_args(LeaseEvent),
        *get_args(GcEvent),
        *get_args(PoolEvent),
        DemandEvent,
        TrafficEvent,
        MeterEvent,
        DeadLettered,
    ]
    assert sorted(c.__name__ for c in families) == sorted(EVENT_TYPES)


def test_each_family_names_the_category_of_its_stream() -> None:
    assert {cls.category for cls in get_args(LeaseEvent)} == {"lease"}
    assert {cls.category for cls in get_args(GcEvent)} == {"gc"}
    assert DemandEvent.category == "demand"
    assert subjects.demand("p1").literal_subjects == ("demand.p1",)
    assert TrafficEvent.category == "traffic"
    assert subjects.traffic("crawler-a").literal_subjects == ("traffic.crawler-a",)
    assert MeterEvent.category == "meter"
    assert subjects.meter("resi-de").literal_subjects == ("meter.resi-de",)
    assert set(subjects.POOL_CATEGORIES) == {cls.category for cls in get_args(PoolEvent)}
    pool = subjects.pool("p1")
    for cls in get_args(PoolEvent):
        assert f"pool.p1.{cls.category}" in pool.literal_subjects
    assert set(subjects.PROXY_CATEGORIES) == {cls.category for cls in get_args(ProxyEvent)}
    # Every proxy event has a subject that its aggregate's concurrency check covers.
    aggregate = subjects.proxy("p1")
    for cls in get_args(ProxyEvent):
        assert f"proxy.p1.{cls.category}" in aggregate.literal_subjects
