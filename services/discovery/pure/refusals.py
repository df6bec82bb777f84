"""Why a lease request got no proxy, told so that the client knows what to do next.

Two answers, told apart by whether any proxy *has* the attributes asked for, leasable or not
(docs/api.md, "Errors"):

- none has them: ``422 no_matching_proxy``, without ``Retry-After``. Waiting will not help, the
  selector is most likely wrong (``{"contry": "de"}``), so the message names the attribute keys
  and values that do exist, and the nearest key to a misspelt one.
- some have them, but none can be leased now: ``503 no_proxy_available`` with ``Retry-After``,
  and how many are leased, cooling down, unhealthy (with what the last probe said), not Ready,
  being deleted, or of a provider whose budget today's bytes spent (``budget_spent``, with the
  bytes, the budget and the 00:00 UTC it resets at, D162). A proxy that is provisioning or
  failing its probes exists and may serve soon: a request for it is right, only early.

A request naming a pool counts only the pool's members, and its answer says what the pool is
doing: a 503 whether it is scaling (members still coming or not Ready: waiting will likely
help), and a pool whose members do not exist yet is a 503 while it scales, not a 422.

Pure: the choice is made from what ``services.discovery.leasing.refusals`` read from the views, in
steps, so that a read only one answer needs (the attribute values a 422 names) is made only
for that answer. The answer is a ``Refusal``; the shell raises it as its ``ApiError``.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from events.poolresource import POOL_ATTRIBUTE
from events.schemas import Phase
from projections.cooldown import Claimant
from projections.lease import LeaseView
from projections.lease_queries import available_at, is_available, is_free, leasable
from projections.meter import Spent
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.discovery.pure.errorcodes import STATUS, ErrorCode
from services.discovery.pure.pools import PoolSummary, scaling_note, template_misses
from services.runtime.pure.poolref import PoolRef

UNKNOWN_WAIT = 5
"""``Retry-After`` when no matching proxy has a known time at which it frees up."""
SHOWN = 10
"""Attribute keys, or values of one key, named in a message at most."""

LEASED = "leased"
COOLING = "cooling down"
BACKED_OFF = "in back-off for the target"
BUDGET_SPENT = "budget_spent"
"""A proxy whose provider entry's bytes of today reached its ``maxBytesPerDay`` (D162)."""
CLAIMED = "claimed by other requests meanwhile"
UNHEALTHY = "unhealthy"
UNPROBED = "not probed yet"
DELETING = "being deleted"

BUSY = STATUS[ErrorCode.NO_PROXY_AVAILABLE]
"""The status of a refusal that waiting may cure (503): the one test of it."""


def is_busy(status: int) -> bool:
    """Whether a refusal says "proxies match, none is free now": the lease path retries after
    a catch-up and waits only then, and counts it ``busy``."""
    return status == BUSY


@dataclass(frozen=True, slots=True)
class Refusal:
    """The error a request that got no proxy is answered with."""

    code: ErrorCode
    message: str
    retry_after: int | None = None
    """``Retry-After`` in seconds (a 503 has it, a 422 not)."""
    scaling: bool | None = None
    """For a pool's 503: whether the pool is scaling; None for any other refusal."""

    @property
    def status(self) -> int:
        return STATUS[self.code]


@dataclass(frozen=True, slots=True)
class Asked:
    """What the refused request asked for."""

    selector: Mapping[str, str]
    exclude: Collection[str] = ()
    only: str | None = None
    """A sticky request's proxy: that one or none."""
    target: str = ""
    pool: PoolRef | None = None
    """The pool named (whose attribute ``selector`` holds)."""
    who: Claimant | None = None
    """Who asked: a proxy resting after its own lease is not cooling down for it (D153)."""


@dataclass(frozen=True, slots=True)
class Standing:
    """One matching proxy as the views show it: its lease and what its egress blocks."""

    proxy: ProxyView
    lease: LeaseView | None
    egress: tuple[str, str]
    """The egress policy's reason to hold it back, and what was seen ("" when none)."""
    budget: Spent | None = None
    """Its provider's budget, when today's bytes have spent it (D162)."""


def choose(asked: Asked, existing: Sequence[str], only: ProxyView | None) -> Refusal | list[str]:
    """The refusal that needs no more reading, or the proxies to tell about (``busy``; none:
    ``nothing_has``). ``existing``: the proxies with the attributes (the pool's members of them);
    ``only``: the sticky request's proxy as the views show it."""
    excluded = set(asked.exclude)
    having = _having(asked)
    if asked.only is not None:
        sticky = asked.only
        if only is None or only.removed:
            return Refusal(
                ErrorCode.UNKNOWN_PROXY,
                f"proxyUid: no proxy {sticky!r}; list them with GET /v1/proxies",
            )
        if sticky in excluded:
            return Refusal(
                ErrorCode.INVALID_REQUEST,
                f"proxyUid: {sticky!r} is also in exclude; leave it out of one",
            )
        if sticky not in existing:
            return Refusal(
                ErrorCode.NO_MATCHING_PROXY,
                f"proxyUid: the proxy {sticky!r} does not have {having}",
            )
        return [sticky]
    uids = [uid for uid in existing if uid not in excluded]
    if existing and not uids:
        return Refusal(
            ErrorCode.NO_MATCHING_PROXY,
            f"every proxy with {having} is in exclude "
            f"({len(existing)} of them); waiting will not help",
        )
    return uids


def busy(asked: Asked, standings: Sequence[Standing], now: datetime) -> Refusal:
    """The 503 for proxies that match but cannot be leased now, counted by reason. With a
    ``target``, ``Retry-After`` counts its back-offs too: it is the time until the earliest
    of them can be leased for it, as far as the log knows (an early release makes it sooner)."""
    reasons, seen, soonest = _tally(standings, now, asked.target, asked.who)
    counts = ", ".join(
        f"{n} {reason}" + (f" ({seen[reason]})" if seen.get(reason) else "")
        for reason, n in reasons.most_common()
    )
    n = sum(reasons.values())
    match = "proxy matches" if n == 1 else "proxies match"
    if soonest is not None:
        wait = max(1, math.ceil((soonest - now).total_seconds()))
    else:
        wait = 1 if reasons[CLAIMED] else UNKNOWN_WAIT
    told = f"{n} {match} {_asked(asked)}, but none can be leased now"
    if asked.target:
        told += f" for the target {asked.target!r}"
    if asked.only is not None:
        told = f"the proxy {asked.only!r} cannot be leased now"
    elif asked.exclude:
        told += " (leaving out those in exclude)"
    return Refusal(ErrorCode.NO_PROXY_AVAILABLE, f"{told}: {counts}", retry_after=wait)


def nothing_has(
    selector: Mapping[str, str], values: Mapping[str, Collection[str]], *, any_proxy: bool
) -> Refusal:
    """The 422 when no proxy has the attributes: what does exist (``values``: the attribute
    values in use, by key), and the nearest key to a misspelt one."""
    return Refusal(ErrorCode.NO_MATCHING_PROXY, _nothing_has(selector, values, any_proxy))


def for_pool(
    asked: Asked,
    refusal: Refusal,
    pool: PoolView,
    got: PoolSummary,
    *,
    members: bool,
) -> Refusal:
    """The refusal of a pool request, told with what the pool is doing: a 503 says whether it
    is scaling; a pool none of whose members exists yet, while it scales, is a 503 too (they
    are on their way), and one whose members can never match the selector a 422. ``members``:
    whether any member has the attributes asked for."""
    ref = asked.pool
    assert ref is not None, "a pool's refusal is for a request naming the pool"
    if refusal.code is ErrorCode.NO_PROXY_AVAILABLE:
        return Refusal(
            refusal.code,
            f"{refusal.message}; {scaling_note(ref, got)}",
            retry_after=refusal.retry_after,
            scaling=got.scaling,
        )
    if refusal.code is not ErrorCode.NO_MATCHING_PROXY or asked.only is not None:
        return refusal
    misses = template_misses(pool, asked.selector)
    if misses:
        attributes = {**pool.spec.template.attributes, POOL_ATTRIBUTE: pool.name}
        return Refusal(
            ErrorCode.NO_MATCHING_PROXY,
            f"no member of the pool {ref} has {misses}: its members have the attributes "
            f"{attributes}; waiting will not help",
        )
    if pool.deleting:
        return Refusal(
            ErrorCode.NO_MATCHING_PROXY, f"the pool {ref} is being deleted; waiting will not help"
        )
    if members:
        return refusal  # members exist, and the request excluded every one
    if got.scaling:
        return Refusal(
            ErrorCode.NO_PROXY_AVAILABLE,
            f"no member of the pool {ref} can be leased yet: {scaling_note(ref, got)}",
            retry_after=UNKNOWN_WAIT,
            scaling=True,
        )
    if not got.figures.desired:
        return Refusal(
            ErrorCode.NO_MATCHING_PROXY,
            f"the pool {ref} has no members (replicas 0); scale it "
            "(`egress-proxies scale pool NAME --replicas N`)",
        )
    return refusal


def _having(asked: Asked) -> str:
    if asked.pool is None:
        return f"the attributes {dict(asked.selector)}"
    return f"the pool {asked.pool}'s attribute in its namespace" + _rest(asked.selector)


def _asked(asked: Asked) -> str:
    if asked.pool is None:
        return f"the selector {dict(asked.selector)}"
    return f"the pool {asked.pool}" + _rest(asked.selector)


def _rest(selector: Mapping[str, str]) -> str:
    """The selector besides the pool's attribute, as a pool request's message names it."""
    rest = {k: v for k, v in selector.items() if k != POOL_ATTRIBUTE}
    return f" and the selector {rest}" if rest else ""


def _tally(
    standings: Sequence[Standing], now: datetime, target: str, who: Claimant | None
) -> tuple[Counter[str], dict[str, str], datetime | None]:
    """Why each proxy cannot be leased, what was seen for a reason that has a finding (the
    last failed probe, the egress that did not match), and the earliest time one of them can
    be leased (for ``target``, by ``who``)."""
    reasons: Counter[str] = Counter()
    seen: dict[str, str] = {}
    soonest: datetime | None = None
    for standing in standings:
        proxy = standing.proxy
        egress_reason, egress_seen = standing.egress
        if leasable(proxy) and egress_reason:
            reasons[egress_reason] += 1
            seen.setdefault(egress_reason, egress_seen)
            continue
        spent = standing.budget
        if leasable(proxy) and spent is not None:
            reasons[BUDGET_SPENT] += 1
            seen.setdefault(BUDGET_SPENT, spent.words())
            if soonest is None or spent.resets_at < soonest:
                soonest = spent.resets_at
            continue
        if leasable(proxy):
            view = standing.lease
            if not is_free(view, now):
                reason = LEASED
            elif not is_available(view, now, who=who):
                reason = COOLING
            elif not is_available(view, now, target, who):
                reason = BACKED_OFF
            else:
                reason = CLAIMED
            when = available_at(view, target, who)
            if when is not None and when > now and (soonest is None or when < soonest):
                soonest = when
        else:
            reason = _not_leasable(proxy)
            if reason == UNHEALTHY and not seen.get(UNHEALTHY):
                seen[UNHEALTHY] = f"last probe: {_probe_message(proxy)}"
        reasons[reason] += 1
    return reasons, seen, soonest


def _not_leasable(proxy: ProxyView) -> str:
    """Why ``candidates.leasable`` refuses the proxy, in the order a reader would look."""
    if proxy.deleting:
        return DELETING
    if proxy.phase is not Phase.READY or not proxy.url:
        return f"not Ready ({proxy.phase.value})"
    return UNPROBED if proxy.healthy is None else UNHEALTHY


def _probe_message(proxy: ProxyView) -> str:
    """What the last failed probe said (the verdict's message, else its reason)."""
    verdict = proxy.verdict
    if verdict is None or verdict.healthy:
        return ""
    return verdict.message or verdict.reason


def _nothing_has(
    selector: Mapping[str, str], values: Mapping[str, Collection[str]], any_proxy: bool
) -> str:
    if not any_proxy:
        return "there are no proxies yet; declare some (`egress-proxies apply -f FILE`)"
    hints: list[str] = []
    for key, value in selector.items():
        if key not in values:
            close = difflib.get_close_matches(key, list(values), n=1)
            hints.append(
                f"no proxy has the attribute {key!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
            )
        elif value not in values[key]:
            hints.append(f"{key!r} is one of {_listed(values[key])}")
    if not hints:
        hints.append("each pair exists, but no single proxy has all of them")
    keys = f"; the attribute keys in use are {_listed(values)}" if values else ""
    return f"no proxy has the attributes {dict(selector)}: {'; '.join(hints)}{keys}"


def _listed(items: Collection[str]) -> str:
    names = sorted(items)
    shown = ", ".join(repr(name) for name in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
