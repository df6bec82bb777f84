"""The error for a lease request that got no proxy, from the views as they are now.

The choice, 422 or 503 and what each says, is ``pure.refusals``; this module reads what it
needs from the views, step by step (the attribute values only for a 422, a pool's summary only
for a pool's request), and raises the answer as its ``ApiError``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from projections.cooldown import Claimant
from services.discovery.http.errors import (
    ApiError,
    InvalidRequest,
    NoMatchingProxy,
    NoProxyAvailable,
    PoolBusy,
    UnknownProxy,
)
from services.discovery.http.pools import members_only, summary, unknown
from services.discovery.pure.errorcodes import ErrorCode
from services.discovery.pure.refusals import (
    Asked,
    Refusal,
    Standing,
    busy,
    choose,
    for_pool,
    nothing_has,
)
from services.discovery.views import Views
from services.runtime.pure.poolref import PoolRef

_ERRORS: dict[ErrorCode, type[ApiError]] = {
    ErrorCode.UNKNOWN_PROXY: UnknownProxy,
    ErrorCode.INVALID_REQUEST: InvalidRequest,
    ErrorCode.NO_MATCHING_PROXY: NoMatchingProxy,
    ErrorCode.NO_PROXY_AVAILABLE: NoProxyAvailable,
}
"""The error each refusal's code is raised as (a pool's 503 is a ``PoolBusy``)."""


def refusal(
    views: Views,
    selector: Mapping[str, str],
    *,
    exclude: Collection[str] = (),
    only: str | None = None,
    target: str = "",
    pool: PoolRef | None = None,
    who: Claimant | None = None,
) -> ApiError:
    """The error for a request that got no proxy. Proxies in ``exclude`` do not count; with
    ``only`` (a sticky request) nothing else does. With a ``pool`` (whose attribute
    ``selector`` holds), only its members count. ``who``: the claimant, whose own rests are
    no obstacle (D153)."""
    asked = Asked(selector, exclude, only, target, pool, who)
    existing = members_only(views, views.candidates.existing(selector), pool)
    chosen = choose(asked, existing, views.proxy(only) if only is not None else None)
    if isinstance(chosen, list):
        chosen = _told(views, asked, chosen)
    if pool is not None:
        found = views.pool(pool.namespace, pool.name)
        if found is None:
            return unknown(views, pool)  # removed while the request ran
        got = summary(views, found)
        chosen = for_pool(asked, chosen, found, got, members=bool(existing))
    return api_error(chosen)


def _told(views: Views, asked: Asked, uids: list[str]) -> Refusal:
    """The 503 about ``uids``, or the 422 when there are none."""
    candidates = views.candidates
    if not uids:
        values = candidates.attribute_values()
        return nothing_has(asked.selector, values, any_proxy=bool(candidates.existing({})))
    standings = []
    for uid in uids:
        proxy = views.proxy(uid)
        if proxy is not None:
            egress = candidates.egress_blocked(proxy)
            budget = views.budget_spent(proxy)
            standings.append(Standing(proxy, views.lease_view(uid), egress, budget))
    return busy(asked, standings, views.now())


def api_error(refusal: Refusal) -> ApiError:
    headers = None if refusal.retry_after is None else {"Retry-After": str(refusal.retry_after)}
    if refusal.scaling is not None:
        return PoolBusy(refusal.message, scaling=refusal.scaling, headers=headers)
    return _ERRORS[refusal.code](refusal.message, headers=headers)
