"""The refusal choice (``services.discovery.pure.refusals``) as tables, from hand-made views:
which requests are refused before anything is counted, what a 503 counts and how long it says
to wait, what a 422 names, and how a pool's request is told. The same choice read from real
views is tested in test_discovery_refusals and test_discovery_pools."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import msgspec
import pytest

from events.pool import PoolFigures, PoolSpec
from events.schemas import HealthChanged, Phase, ProxySpec
from projections.cooldown import Claimant
from projections.lease import LeaseView
from projections.meter import Spent
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.discovery.pure.errorcodes import ErrorCode
from services.discovery.pure.pools import PoolSummary
from services.discovery.pure.refusals import (
    UNKNOWN_WAIT,
    Asked,
    Refusal,
    Standing,
    busy,
    choose,
    for_pool,
    nothing_has,
)
from services.runtime.pure.poolref import PoolRef
from tests.support.hand_views import held_lease

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
SELECTOR = {"country": "de"}
NO_MATCH, NO_PROXY = ErrorCode.NO_MATCHING_PROXY, ErrorCode.NO_PROXY_AVAILABLE


def proxy(uid: str, **changes: object) -> ProxyView:
    values: dict[str, object] = {
        "uid": uid,
        "spec": ProxySpec(provider="gcp"),
        "phase": Phase.READY,
        "url": "http://10.0.0.1:3128",
        "healthy": True,
    }
    values.update(changes)
    return ProxyView(**values)  # type: ignore[arg-type]


def lease(uid: str, *, ends_in: float, cooldown: float = 0.0, client: str = "") -> LeaseView:
    view = held_lease(uid, NOW, ends_in=ends_in, cooldown=cooldown)
    assert view.current is not None
    return msgspec.structs.replace(
        view, current=msgspec.structs.replace(view.current, client=client)
    )


# ----------------------------------------------------------------------- before counting


@dataclass(frozen=True)
class Early:
    name: str
    asked: Asked
    existing: list[str]
    only: ProxyView | None
    chosen: ErrorCode | list[str]


EARLY = [
    Early("all-counted", Asked(SELECTOR), ["a", "b"], None, ["a", "b"]),
    Early("excluded-left-out", Asked(SELECTOR, exclude=("a",)), ["a", "b"], None, ["b"]),
    Early("all-excluded", Asked(SELECTOR, exclude=("a", "b")), ["a", "b"], None, NO_MATCH),
    Early("nothing-exists", Asked(SELECTOR), [], None, []),
    Early("sticky", Asked(SELECTOR, only="a"), ["a", "b"], proxy("a"), ["a"]),
    Early("sticky-unknown", Asked(SELECTOR, only="x"), ["a"], None, ErrorCode.UNKNOWN_PROXY),
    Early(
        "sticky-removed",
        Asked(SELECTOR, only="a"),
        ["a"],
        proxy("a", removed=True),
        ErrorCode.UNKNOWN_PROXY,
    ),
    Early(
        "sticky-excluded",
        Asked(SELECTOR, exclude=("a",), only="a"),
        ["a"],
        proxy("a"),
        ErrorCode.INVALID_REQUEST,
    ),
    Early("sticky-lacks-attributes", Asked(SELECTOR, only="c"), ["a"], proxy("c"), NO_MATCH),
]


@pytest.mark.parametrize("row", EARLY, ids=lambda r: r.name)
def test_what_is_refused_before_counting(row: Early) -> None:
    chosen = choose(row.asked, row.existing, row.only)
    if isinstance(row.chosen, list):
        assert chosen == row.chosen
    else:
        assert isinstance(chosen, Refusal)
        assert chosen.code is row.chosen
        assert chosen.retry_after is None


# ------------------------------------------------------------------------------- the 503


@dataclass(frozen=True)
class Busy:
    name: str
    standings: list[Standing]
    counted: str
    retry_after: int
    target: str = ""
    who: Claimant | None = None


def up(uid: str, view: LeaseView | None = None, egress: tuple[str, str] = ("", "")) -> Standing:
    return Standing(proxy(uid), view, egress)


def down(view: ProxyView) -> Standing:
    return Standing(view, None, ("", ""))


SICK = down(proxy("s", healthy=False, verdict=HealthChanged(healthy=False, message="refused")))
LATER = UNKNOWN_WAIT
HELD, SOON = up("a", lease("a", ends_in=30)), up("b", lease("b", ends_in=8))
NEW = down(proxy("p", phase=Phase.PROVISIONING))
A, B = Claimant(client="crawler-a"), Claimant(client="crawler-b")
A_RESTS = up("a", lease("a", ends_in=-1, cooldown=20, client="crawler-a"))
A_HOLDS = up("a", lease("a", ends_in=8, cooldown=20, client="crawler-a"))
MISMATCH = up("e", egress=("egress mismatch", "seen fr"))
MIDNIGHT = datetime(2026, 1, 2, tzinfo=UTC)
SPENT = Standing(proxy("r"), None, ("", ""), Spent("resi-de", 1500, 1000, MIDNIGHT))
SPENT_SAID = (
    "1 budget_spent (provider 'resi-de' moved 1500 bytes today, its budget is 1000 bytes a day "
    "(maxBytesPerDay); leasable again at 2026-01-02T00:00:00Z)"
)
BUSY = [
    Busy("leased", [HELD], "1 leased", 30),
    Busy("resting", [up("a", lease("a", ends_in=-1, cooldown=20))], "1 cooling down", 19),
    Busy("soonest", [HELD, SOON], "2 leased", 8),
    Busy("claimed-meanwhile", [up("a")], "1 claimed by other requests meanwhile", 1),
    Busy("unhealthy-says-why", [SICK], "1 unhealthy (last probe: refused)", LATER),
    Busy("not-probed", [down(proxy("n", healthy=None))], "1 not probed yet", LATER),
    Busy("not-ready", [NEW], "1 not Ready (Provisioning)", LATER),
    Busy("deleting", [down(proxy("d", deleting=True))], "1 being deleted", LATER),
    Busy("egress", [MISMATCH], "1 egress mismatch (seen fr)", LATER),
    # A spent budget says whose, how much and until when; the wait is until 00:00 UTC (D162).
    Busy("budget-spent", [SPENT], SPENT_SAID, 12 * 3600),
    Busy("budget-and-a-lease-ending", [SPENT, SOON], f"{SPENT_SAID}, 1 leased", 8),
    Busy("egress-before-budget", [replace(SPENT, egress=("egress mismatch", "fr"))],
         "1 egress mismatch (fr)", LATER),
    Busy("unhealthy-before-budget", [replace(SICK, budget=SPENT.budget)],
         "1 unhealthy (last probe: refused)", LATER),
    # A rest after the asking client's own lease is no obstacle to it, only to others (D153).
    Busy("own-rest", [A_RESTS], "1 claimed by other requests meanwhile", 1, who=A),
    Busy("other-s-rest", [A_RESTS], "1 cooling down", 19, who=B),
    Busy("own-lease-ends", [A_HOLDS], "1 leased", 8, who=A),
    Busy("other-s-lease-ends-and-rests", [A_HOLDS], "1 leased", 28, who=B),
]  # fmt: skip


@pytest.mark.parametrize("row", BUSY, ids=lambda r: r.name)
def test_a_503_counts_each_reason_and_says_when_to_come_back(row: Busy) -> None:
    refusal = busy(Asked(SELECTOR, target=row.target, who=row.who), row.standings, NOW)
    assert (refusal.code, refusal.status, refusal.scaling) == (NO_PROXY, 503, None)
    assert refusal.message.endswith(f"but none can be leased now: {row.counted}"), refusal.message
    assert refusal.retry_after == row.retry_after


def test_a_sticky_503_names_its_proxy_and_a_target_its_target() -> None:
    sticky = busy(Asked(SELECTOR, only="a"), [up("a", lease("a", ends_in=5))], NOW)
    assert sticky.message == "the proxy 'a' cannot be leased now: 1 leased"
    aimed = busy(Asked(SELECTOR, exclude=("z",), target="example.com"), [up("a")], NOW)
    assert aimed.message.startswith(
        "1 proxy matches the selector {'country': 'de'}, but none can be leased now for the "
        "target 'example.com' (leaving out those in exclude): "
    )


# ------------------------------------------------------------------------------- the 422


@pytest.mark.parametrize(
    ("selector", "values", "any_proxy", "said"),
    [
        ({"contry": "de"}, {"country": {"de"}}, True, "'contry' (did you mean 'country'?)"),
        ({"country": "fr"}, {"country": {"us", "de"}}, True, "'country' is one of 'de', 'us'"),
        ({"a": "1", "b": "2"}, {"a": {"1"}, "b": {"2"}}, True, "no single proxy has all of them"),
        ({"a": "1"}, {}, False, "there are no proxies yet"),
        ({"k": "x"}, {"k": {f"v{n:02}" for n in range(12)}}, True, "'v09' and 2 more"),
    ],
    ids=["misspelt-key", "unknown-value", "pairs-apart", "empty-fleet", "long-lists-cut"],
)  # fmt: skip
def test_a_422_names_what_exists(
    selector: dict[str, str], values: dict[str, set[str]], any_proxy: bool, said: str
) -> None:
    refusal = nothing_has(selector, values, any_proxy=any_proxy)
    assert (refusal.code, refusal.status, refusal.retry_after) == (NO_MATCH, 422, None)
    assert said in refusal.message


# ------------------------------------------------------------------------------ a pool's


REF = PoolRef("crawl", "de")
POOL_SELECTOR = {"pool": "de"}


def pool(**changes: object) -> PoolView:
    spec = PoolSpec(replicas=2, template=ProxySpec(attributes={"country": "de"}))
    values: dict[str, object] = {"uid": "pu", "namespace": "crawl", "name": "de", "spec": spec}
    values.update(changes)
    return PoolView(**values)  # type: ignore[arg-type]


def summary(desired: int, members: int, ready: int, *, scaling: bool) -> PoolSummary:
    seen = PoolFigures(desired=desired, members=members, ready=ready)
    return PoolSummary(figures=seen, available=0, providers={}, scaling=scaling)


STEADY = summary(2, 2, 2, scaling=False)


@dataclass
class Pooled:
    name: str
    refusal: Refusal
    code: ErrorCode
    scaling: bool | None
    said: str
    view: PoolView = field(default_factory=pool)
    got: PoolSummary = field(default_factory=lambda: STEADY)
    members: bool = False
    selector: dict[str, str] = field(default_factory=lambda: dict(POOL_SELECTOR))
    only: str | None = None


BUSY_503 = Refusal(NO_PROXY, "2 proxies match the pool crawl/de, but none", retry_after=7)
NOTHING = Refusal(NO_MATCH, "no proxy has the attributes")
NAMED = "no proxy has the attributes"
GROWING = summary(4, 2, 2, scaling=True)
COMING, NONE = summary(2, 0, 0, scaling=True), summary(0, 0, 0, scaling=False)
FR = {"pool": "de", "country": "fr"}
POOLED = [
    Pooled("busy-steady", BUSY_503, NO_PROXY, False, "but none; the pool"),
    Pooled("busy-scaling", BUSY_503, NO_PROXY, True, "but none;", got=GROWING),
    Pooled("misses", NOTHING, NO_MATCH, None, "crawl/de has {'country': 'fr'}", selector=FR),
    Pooled("deleting", NOTHING, NO_MATCH, None, "is being deleted", view=pool(deleting=True)),
    Pooled("members-excluded", NOTHING, NO_MATCH, None, NAMED, members=True),
    Pooled("members-coming", NOTHING, NO_PROXY, True, "can be leased yet", got=COMING),
    Pooled("replicas-0", NOTHING, NO_MATCH, None, "has no members (replicas 0)", got=NONE),
    Pooled("sticky-as-is", NOTHING, NO_MATCH, None, NAMED, only="a", got=COMING),
]


@pytest.mark.parametrize("row", POOLED, ids=lambda r: r.name)
def test_a_pools_refusal_says_what_the_pool_does(row: Pooled) -> None:
    asked = Asked(row.selector, only=row.only, pool=REF)
    told = for_pool(asked, row.refusal, row.view, row.got, members=row.members)
    assert (told.code, told.scaling) == (row.code, row.scaling)
    assert row.said in told.message, told.message
    if told.code is NO_PROXY:
        assert told.retry_after == (7 if row.refusal is BUSY_503 else UNKNOWN_WAIT)
