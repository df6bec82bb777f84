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
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from collections.abc import Collection, Mapping
from datetime import datetime

from events.schemas import Phase
from projections.lease_queries import available_at, is_available, is_free
from projections.proxy import ProxyView
from services.discovery.errors import (
    ApiError,
    InvalidRequest,
    NoMatchingProxy,
    NoProxyAvailable,
    UnknownProxy,
)
from services.discovery.pure.candidates import leasable
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
) -> ApiError:
    """The error for a request that got no proxy, from the views as they are now. Proxies in
    ``exclude`` do not count; with ``only`` (a sticky request) nothing else does. With a
    ``target``, ``Retry-After`` counts its back-offs too: it is the time until the earliest
    matching proxy can be leased for it, as far as the log knows (an early release makes it
    sooner)."""
    excluded = set(exclude)
    if only is not None:
        proxy = views.proxy(only)
        if proxy is None or proxy.removed:
            return UnknownProxy(f"proxyUid: no proxy {only!r}; list them with GET /v1/proxies")
        if only in excluded:
            return InvalidRequest(f"proxyUid: {only!r} is also in exclude; leave it out of one")
        if only not in views.candidates.existing(selector):
            return NoMatchingProxy(
                f"proxyUid: the proxy {only!r} does not have the attributes {dict(selector)}"
            )
        uids = [only]
    else:
        found = views.candidates.existing(selector)
        uids = [uid for uid in found if uid not in excluded]
        if found and not uids:
            return NoMatchingProxy(
                f"every proxy with the attributes {dict(selector)} is in exclude "
                f"({len(found)} of them); waiting will not help"
            )
    if not uids:
        return NoMatchingProxy(_nothing_has(views, selector))
    now = views.now()
    reasons, probe, soonest = _tally(views, uids, now, target)
    counts = ", ".join(
        f"{n} {reason}" + (f" (last probe: {probe})" if reason == UNHEALTHY and probe else "")
        for reason, n in reasons.most_common()
    )
    n = sum(reasons.values())
    match = "proxy matches" if n == 1 else "proxies match"
    if soonest is not None:
        wait = max(1, math.ceil((soonest - now).total_seconds()))
    else:
        wait = 1 if reasons[CLAIMED] else UNKNOWN_WAIT
    told = f"{n} {match} the selector {dict(selector)}, but none can be leased now"
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


def _tally(
    views: Views, uids: list[str], now: datetime, target: str
) -> tuple[Counter[str], str, datetime | None]:
    """Why each proxy cannot be leased, what the last failed probe said, and the earliest time
    one of them can be leased (for ``target``)."""
    reasons: Counter[str] = Counter()
    probe = ""
    soonest: datetime | None = None
    for uid in uids:
        proxy = views.proxy(uid)
        if proxy is None:
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
            if reason == UNHEALTHY:
                probe = probe or _probe_message(proxy)
        reasons[reason] += 1
    return reasons, probe, soonest


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
