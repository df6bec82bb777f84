"""Discovery's index of spent budgets (``Views.spent_providers``, D162), fed records as its
projector would: spent once a day's bytes reach the budget, no longer when a later record of the
day carries a larger one, only for the day it was spent, and rebuilt from restored views; what
the lease path keeps of the candidates (``leasing.choosing.kept_by``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from events.meter import UpstreamMetered
from events.schemas import ProxyDeclared, ProxySpec
from events.store import Recorded
from projections import meter
from projections.proxy import ProxyView
from services.discovery.leasing.choosing import kept_by
from services.discovery.pure.drawing import Candidates
from services.discovery.views import Views
from services.runtime.eventlog.memory import InMemoryEventStore

DAY1 = datetime(2026, 12, 7, 9, tzinfo=UTC)


def views(clock: list[datetime]) -> Views:
    return Views(None, InMemoryEventStore(), snapshots=False, clock=lambda: clock[0])  # type: ignore[arg-type]


def record(views: Views, provider: str, moved: int, budget: int, seq: int) -> None:
    event = UpstreamMetered(
        provider=provider,
        replica="executor-1",
        start=DAY1,
        interval_seconds=10.0,
        proxy_uid=f"{provider}-1",
        bytes_up=moved,
        budget_bytes_per_day=budget,
    )
    stored = Recorded(event, seq, f"meter.{provider}", DAY1)
    views.meter.views[provider] = views._on_meter(views.meter.views.get(provider), stored)


def declare(views: Views, uid: str, provider: str) -> None:
    spec = ProxySpec(provider=provider)
    event = ProxyDeclared(uid=uid, namespace="crawl", name=uid, spec=spec)
    views.proxies.views[uid] = views._on_proxy(
        None, Recorded(event, 1, f"proxy.{uid}.declared", DAY1)
    )


def test_a_budget_is_spent_for_its_day_and_unspent_by_a_larger_one() -> None:
    clock = [DAY1]
    got = views(clock)
    record(got, "resi-de", 900, 1000, 1)
    record(got, "resi-fr", 5000, 0, 2)  # no budget: never spent
    assert got.spent_providers() == set()
    record(got, "resi-de", 100, 1000, 3)
    assert got.spent_providers() == {"resi-de"}
    spent = got.budget_spent(declared(got, "de-1", "resi-de"))
    assert spent is not None
    assert (spent.used, spent.budget) == (1000, 1000)
    record(got, "resi-de", 1, 5000, 4)  # raised the same day
    assert got.spent_providers() == set()
    record(got, "resi-de", 1, 1000, 5)
    assert got.spent_providers() == {"resi-de"}
    clock[0] += timedelta(days=1)
    assert got.spent_providers() == set()
    assert got.budget_spent(declared(got, "de-1", "resi-de")) is None


def test_restored_views_rebuild_the_index_and_the_lease_path_leaves_spent_proxies_out() -> None:
    clock = [DAY1]
    first = views(clock)
    record(first, "resi-de", 2000, 1000, 1)
    again = views(clock)
    for provider, view in first.meter.views.items():
        again.meter.views[provider] = view
        again._restored_meter(provider, view)
    assert again.spent_providers() == {"resi-de"}
    declare(again, "de-1", "resi-de")
    declare(again, "fr-1", "resi-fr")
    declare(again, "vm-1", "gcp")
    offered = ["de-1", "fr-1", "vm-1", "gone"]
    assert list(Candidates(offered, kept_by(again, None, ()))) == ["fr-1", "vm-1"]
    assert list(Candidates(offered, kept_by(again, None, ["vm-1"]))) == ["fr-1"]
    clock[0] += timedelta(days=1)
    assert kept_by(again, None, ()) is None  # nothing spent: nothing asked per proxy
    assert list(Candidates(offered[:2], kept_by(again, None, ()))) == ["de-1", "fr-1"]
    assert meter.day_of(clock[0]) not in again.spent_on


def declared(views: Views, uid: str, provider: str) -> ProxyView:
    declare(views, uid, provider)
    view = views.proxy(uid)
    assert view is not None
    return view
