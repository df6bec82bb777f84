"""Why a lease request got no proxy, told so that the client knows what to do next.

Two answers, told apart by whether any proxy *has* the attributes asked for, leasable or not
(docs/api.md, "Errors"):

- none has them: ``422 no_matching_proxy``, without ``Retry-After``. Waiting will not help, the
  selector is most likely wrong (``{"contry": "de"}``), so the message names the attribute keys
  and values that do exist, and the nearest key to a misspelt one.
- some have them, but none can be leased now: ``503 no_proxy_available`` with ``Retry-After``,
  and how many are leased, cooling down, unhealthy (with what the last probe said), not Ready or
  being deleted. A proxy that is provisioning or failing its probes exists and may serve soon: a
  request for it is right, only early.

A request naming a pool counts only the pool's members, and its answer says what the pool is
doing: a 503 whether it is scaling (members still coming or not Ready: waiting will likely
help), and a pool whose members do not exist yet is a 503 while it scales, not a 422.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from collections.abc import Collection, Mapping
from datetime import datetime

from events.poolresource import POOL_ATTRIBUTE
from events.schemas import Phase
from projections.lease_queries import available_at, is_available, is_free, leasable
from projections.proxy import ProxyView
from services.discovery.errors import (
    ApiError,
    InvalidRequest,
    NoMatchingProxy,
    NoProxyAvailable,
    PoolBusy,
    UnknownProxy,
)
from services.discovery.pools import members_only, summary, unknown
from services.discovery.pure.pools import PoolRef, scaling_note, template_misses
from services.discovery.views import Views

UNKNOWN_WAIT = 5
"""``Retry-After`` when no matching proxy has a known time at which it frees up."""
SHOWN = 10
"""Attribute keys, or values of one key, named in a message at most."""

LEASED = "leased"
COOLING = "cooling down"
BACKED_OFF = "in back-off for the target"
CLAIMED = "claimed by other requests meanwhile"
UNHEALTHY = "unhealthy"
UNPROBED = "not probed yet"
DELETING = "being deleted"


def refusal(
    views: Views,
    selector: Mapping[str, str],
    *,
    exclude: Collection[str] = (),
    only: str | None = None,
    target: str = "",
    pool: PoolRef | None = None,
) -> ApiError:
    """The error for a request that got no proxy, from the views as they are now. Proxies in
    ``exclude`` do not count; with ``only`` (a sticky request) nothing else does. With a
    ``target``, ``Retry-After`` counts its back-offs too: it is the time until the earliest
    matching proxy can be leased for it, as far as the log knows (an early release makes it
    sooner). With a ``pool`` (whose attribute ``selector`` holds), only its members count."""
    error = _refusal(views, selector, exclude=exclude, only=only, target=target, pool=pool)
    if pool is None:
        return error
    return _for_pool(views, pool, selector, error, sticky=only is not None)


def _refusal(
    views: Views,
    selector: Mapping[str, str],
    *,
    exclude: Collection[str],
    only: str | None,
    target: str,
    pool: PoolRef | None,
) -> ApiError:
    excluded = set(exclude)
    existing = members_only(views, views.candidates.existing(selector), pool)
    having = _having(selector, pool)
    if only is not None:
        proxy = views.proxy(only)
        if proxy is None or proxy.removed:
            return UnknownProxy(f"proxyUid: no proxy {only!r}; list them with GET /v1/proxies")
        if only in excluded:
            return InvalidRequest(f"proxyUid: {only!r} is also in exclude; leave it out of one")
        if only not in existing:
            return NoMatchingProxy(f"proxyUid: the proxy {only!r} does not have {having}")
        uids = [only]
    else:
        uids = [uid for uid in existing if uid not in excluded]
        if existing and not uids:
            return NoMatchingProxy(
                f"every proxy with {having} is in exclude "
                f"({len(existing)} of them); waiting will not help"
            )
    if not uids:
        return NoMatchingProxy(_nothing_has(views, selector))
    now = views.now()
    reasons, seen, soonest = _tally(views, uids, now, target)
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
    told = f"{n} {match} {_asked(selector, pool)}, but none can be leased now"
    if target:
        told += f" for the target {target!r}"
    if only is not None:
        told = f"the proxy {only!r} cannot be leased now"
    elif excluded:
        told += " (leaving out those in exclude)"
    return NoProxyAvailable(
        f"{told}: {counts}",
        headers={"Retry-After": str(wait)},
    )


def _having(selector: Mapping[str, str], pool: PoolRef | None) -> str:
    if pool is None:
        return f"the attributes {dict(selector)}"
    return f"the pool {pool}'s attribute in its namespace" + _rest(selector)


def _asked(selector: Mapping[str, str], pool: PoolRef | None) -> str:
    if pool is None:
        return f"the selector {dict(selector)}"
    return f"the pool {pool}" + _rest(selector)


def _rest(selector: Mapping[str, str]) -> str:
    """The selector besides the pool's attribute, as a pool request's message names it."""
    rest = {k: v for k, v in selector.items() if k != POOL_ATTRIBUTE}
    return f" and the selector {rest}" if rest else ""


def _for_pool(
    views: Views, ref: PoolRef, selector: Mapping[str, str], error: ApiError, *, sticky: bool
) -> ApiError:
    """The refusal of a pool request, told with what the pool is doing: a 503 says whether it
    is scaling; a pool none of whose members exists yet, while it scales, is a 503 too (they
    are on their way), and one whose members can never match the selector a 422."""
    pool = views.pool(ref.namespace, ref.name)
    if pool is None:
        return unknown(views, ref)  # removed while the request ran
    got = summary(views, pool)
    if isinstance(error, NoProxyAvailable):
        return PoolBusy(
            f"{error.message}; {scaling_note(ref, got)}", scaling=got.scaling, headers=error.headers
        )
    if not isinstance(error, NoMatchingProxy) or sticky:
        return error
    misses = template_misses(pool, selector)
    if misses:
        attributes = {**pool.spec.template.attributes, POOL_ATTRIBUTE: pool.name}
        return NoMatchingProxy(
            f"no member of the pool {ref} has {misses}: its members have the attributes "
            f"{attributes}; waiting will not help"
        )
    if pool.deleting:
        return NoMatchingProxy(f"the pool {ref} is being deleted; waiting will not help")
    if members_only(views, views.candidates.existing(selector), ref):
        return error  # members exist, and the request excluded every one
    if got.scaling:
        return PoolBusy(
            f"no member of the pool {ref} can be leased yet: {scaling_note(ref, got)}",
            scaling=True,
            headers={"Retry-After": str(UNKNOWN_WAIT)},
        )
    if not got.figures.desired:
        return NoMatchingProxy(
            f"the pool {ref} has no members (replicas 0); scale it "
            "(`egress-proxies scale pool NAME --replicas N`)"
        )
    return error


def _tally(
    views: Views, uids: list[str], now: datetime, target: str
) -> tuple[Counter[str], dict[str, str], datetime | None]:
    """Why each proxy cannot be leased, what was seen for a reason that has a finding (the
    last failed probe, the egress that did not match), and the earliest time one of them can
    be leased (for ``target``)."""
    reasons: Counter[str] = Counter()
    seen: dict[str, str] = {}
    soonest: datetime | None = None
    for uid in uids:
        proxy = views.proxy(uid)
        if proxy is None:
            continue
        egress_reason, egress_seen = views.candidates.egress_blocked(proxy)
        if leasable(proxy) and egress_reason:
            reasons[egress_reason] += 1
            seen.setdefault(egress_reason, egress_seen)
            continue
        if leasable(proxy):
            view = views.lease_view(uid)
            if not is_free(view, now):
                reason = LEASED
            elif not is_available(view, now):
                reason = COOLING
            elif not is_available(view, now, target):
                reason = BACKED_OFF
            else:
                reason = CLAIMED
            when = available_at(view, target)
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


def _nothing_has(views: Views, selector: Mapping[str, str]) -> str:
    values = views.candidates.attribute_values()
    if not views.candidates.existing({}):
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


def _listed(items: Mapping[str, object] | set[str]) -> str:
    names = sorted(items)
    shown = ", ".join(repr(name) for name in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
