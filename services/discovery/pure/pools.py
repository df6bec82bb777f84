"""Pools as the discovery API shows them, and the ``pool`` of a lease request
(docs/api.md, "Pools").

A pool's figures are counted as the pool controller counts them (``projections.pool_members``),
off the same shared views, so ``GET /v1/pools`` and the controller's decisions agree. A lease
request naming a pool asks for a proxy carrying the pool's attribute in the pool's namespace:
the members, and nothing of the same name elsewhere (how a pool is named:
``services.runtime.pure.poolref``). Pure: the caller passes the member states.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from events.customresource import DNS_LABEL
from events.pool import PoolFigures
from events.poolresource import POOL_ATTRIBUTE
from events.schemas import Condition
from projections.pool import PoolView
from projections.pool_members import MemberState, figures
from services.runtime.pure.poolref import SHOWN, PoolRef

LISTED = 10
"""Pools an unknown pool's message names at most."""


def unknown_pool_hint(ref: PoolRef, known: Collection[PoolRef]) -> str:
    """What to write instead of an unknown ``ref``: the pools of that name in other namespaces,
    else the pools there are. The API's 404 and the CLI's error say it in the same words."""
    ordered = sorted(known, key=lambda p: (p.namespace, p.name))
    same = [str(p) for p in ordered if p.name == ref.name]
    if same:
        return f"pools named {ref.name!r}: {', '.join(same[:LISTED])}; write NAMESPACE/NAME"
    if ordered:
        names = ", ".join(str(p) for p in ordered[:LISTED])
        more = f" and {len(ordered) - LISTED} more" if len(ordered) > LISTED else ""
        return f"the pools are {names}{more}"
    return "there are no pools; declare one (`egress-proxies apply -f FILE`)"


def check_namespace(text: str) -> str:
    """A namespace of a query, or ValueError with the rule."""
    if not DNS_LABEL.fullmatch(text):
        shown = repr(text[:SHOWN])
        raise ValueError(f"{shown} is no namespace: use 1-63 lowercase letters, digits or '-'")
    return text


def pool_selector(selector: Mapping[str, str], pool: PoolRef) -> dict[str, str]:
    """The selector a pool request leases with: the pool's attribute added (the lease records
    it, and a client's allowed selectors are checked against it). ValueError when the selector
    names another pool already."""
    named = selector.get(POOL_ATTRIBUTE)
    if named is not None and named != pool.name:
        raise ValueError(
            f"the selector's {POOL_ATTRIBUTE!r} is {named[:SHOWN]!r} but pool names "
            f"{pool.name!r}; leave {POOL_ATTRIBUTE!r} out of the selector"
        )
    return {**selector, POOL_ATTRIBUTE: pool.name}


ANY_NAMESPACE = "*"
"""The namespace a bare ``pool`` attribute in a selector stands for: members of that name in
every namespace. No client's binding is written with it, so none allows it."""


def bound_selector(selector: Mapping[str, str], pool: PoolRef | None) -> dict[str, str]:
    """The selector a client's allowed selectors are checked against: its ``pool`` as the
    ``NAMESPACE/NAME`` the request leases from, since a client's binding names the namespace
    (``services.runtime.pure.clients``, docs/decisions/0139-the-discovery-api-s-edges.md). A
    ``pool`` attribute sent without the request's ``pool`` matches members of every namespace,
    so it becomes ``*/NAME``, which no binding allows."""
    if pool is not None:
        return {**selector, POOL_ATTRIBUTE: str(pool)}
    named = selector.get(POOL_ATTRIBUTE)
    if named is None:
        return dict(selector)
    return {**selector, POOL_ATTRIBUTE: f"{ANY_NAMESPACE}/{named}"}


def template_misses(pool: PoolView, selector: Mapping[str, str]) -> dict[str, str]:
    """Selector pairs no member of ``pool`` can have: its template's attributes (and the pool's
    own) are every member's, so waiting for the pool will not bring them."""
    attributes = {**pool.spec.template.attributes, POOL_ATTRIBUTE: pool.name}
    return {k: v for k, v in selector.items() if attributes.get(k) != v}


@dataclass(frozen=True, slots=True)
class ProviderCount:
    members: int
    ready: int


@dataclass(frozen=True, slots=True)
class PoolSummary:
    figures: PoolFigures
    available: int
    """Members a lease request could get now (``candidates.leasable``, free, not cooling)."""
    providers: dict[str, ProviderCount]
    scaling: bool


def is_scaling(seen: PoolFigures) -> bool:
    """More members are coming, or some are not Ready yet: a request refused now may be served
    once they are (a pool shrinking to its size is not scaling in this sense)."""
    return seen.members < seen.desired or seen.ready < seen.members


def summarize(
    pool: PoolView, states: Mapping[str, MemberState], available: Collection[str]
) -> PoolSummary:
    """The pool's figures from its members' states; ``available``: the uids of members a lease
    request could get now."""
    seen = figures(pool, states)
    providers: dict[str, ProviderCount] = {}
    for planned in pool.active():
        member = planned.member
        state = states.get(member.uid)
        had = providers.get(member.provider, ProviderCount(0, 0))
        ready = int(state is not None and state.ready)
        providers[member.provider] = ProviderCount(had.members + 1, had.ready + ready)
    wanted = {p.member.uid for p in pool.active()}
    return PoolSummary(
        figures=seen,
        available=sum(1 for uid in set(available) if uid in wanted),
        providers=dict(sorted(providers.items())),
        scaling=not pool.deleting and is_scaling(seen),
    )


def _size(seen: PoolFigures) -> str:
    return f"{seen.members} of {seen.desired} members, {seen.ready} Ready"


def conditions(pool: PoolView, summary: PoolSummary) -> list[Condition]:
    """``Ready``: every member it wants is there and Ready; ``Scaling``: members are being
    added or are not Ready yet (``is_scaling``)."""
    seen = summary.figures
    size = _size(seen)
    if pool.deleting:
        return [
            Condition(type="Ready", status="False", reason="Deleting", message=size),
            Condition(type="Scaling", status="False", reason="Deleting", message=size),
        ]
    ready = not summary.scaling and seen.ready >= seen.desired
    if summary.scaling:
        reason = "ScaleUp" if seen.members < seen.desired else "MembersNotReady"
        scaling = Condition(type="Scaling", status="True", reason=reason, message=size)
    else:
        reason = "ScaleDown" if seen.members > seen.desired else "AtSize"
        scaling = Condition(type="Scaling", status="False", reason=reason, message=size)
    return [
        Condition(
            type="Ready",
            status=str(ready),
            reason="MembersReady" if ready else "Scaling",
            message=size,
        ),
        scaling,
    ]


def scaling_note(pool: PoolRef, summary: PoolSummary) -> str:
    """What a 503 for a pool request adds: whether waiting brings more members."""
    size = _size(summary.figures)
    if summary.scaling:
        return f"the pool {pool} is scaling ({size}): more may be leasable soon"
    return f"the pool {pool} is not scaling ({size})"
