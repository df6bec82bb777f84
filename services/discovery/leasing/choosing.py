"""The candidates of one acquire: what it draws from and what each drawn proxy must pass
(services/discovery/pure/drawing.py says why nothing here walks the fleet).

The index answers the selector (an intersection, or the live leasable set when there is none);
the rest of a request's conditions are asked of each proxy drawn, in one test: its pool's
namespace (a proxy of another namespace with the pool's attribute is no member), its provider's
budget not spent today (D162), and not excluded by the request.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from services.discovery.pure.drawing import Candidates
from services.discovery.views import Views
from services.runtime.pure.poolref import PoolRef


def candidates_of(
    views: Views,
    selector: Mapping[str, str],
    *,
    pool: PoolRef | None,
    exclude: Collection[str],
    only: str | None,
) -> Candidates:
    """The proxies this request may get now, to be drawn from (``Candidates.drawn``)."""
    found = views.candidates.to_draw(selector, only)
    return found.also(kept_by(views, pool, exclude))


def kept_by(
    views: Views, pool: PoolRef | None, exclude: Collection[str]
) -> Callable[[str], bool] | None:
    """The test of each drawn uid; None when every matching uid passes (the usual request:
    nothing excluded, no pool, no provider's budget spent today, so nothing read per proxy)."""
    spent = views.spent_providers()
    excluded = frozenset(exclude)
    namespace = pool.namespace if pool is not None else None
    if namespace is None and not spent:
        return (lambda uid: uid not in excluded) if excluded else None

    def keep(uid: str) -> bool:
        if uid in excluded:
            return False
        proxy = views.proxy(uid)
        return (
            proxy is not None
            and (namespace is None or proxy.namespace == namespace)
            and proxy.spec.provider not in spent
        )

    return keep
