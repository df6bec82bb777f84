"""``get --at`` and ``events --until``: the log as it was at an instant (docs/console.md).

The views are folded from the first event up to the instant with the services' own folds
(``services.runtime.eventlog.asof``), so the answer is what ``get`` would have printed then,
leases judged at that instant too. It costs a replay of the log up to then.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click

from events.subjects import LEASE_STREAM, PROXY_STREAM
from projections import lease as lease_fold
from projections import proxy as proxy_fold
from projections.lease import LeaseView
from projections.proxy import ProxyView
from services.runtime.connection import Connection
from services.runtime.eventlog.asof import ByProxy, parse_instant, read_until


def instant_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> datetime | None:
    """A ``--at`` / ``--until`` value: an ISO 8601 time, not in the future."""
    del ctx
    if value is None:
        return None
    name = f"--{param.name}"
    try:
        at = parse_instant(value, name)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if at > datetime.now(UTC):
        raise click.BadParameter(f"{name}: {value} is in the future; leave it out for now")
    return at


async def as_of(
    conn: Connection, namespace: str | None, at: datetime
) -> tuple[list[ProxyView], dict[str, LeaseView]]:
    """What ``get`` lists, and the lease views, as folded from the log up to ``at``."""
    proxies = ByProxy(proxy_fold.apply, PROXY_STREAM)
    leases = ByProxy(lease_fold.apply, LEASE_STREAM)
    await read_until(conn.js, PROXY_STREAM, "proxy.*.*", at, each=proxies.fold)
    await read_until(conn.js, LEASE_STREAM, "lease.*", at, each=leases.fold)
    views = [v for v in proxies.views.values() if v.name and not v.removed]
    if namespace:
        views = [v for v in views if v.namespace == namespace]
    return sorted(views, key=lambda v: (v.namespace, v.name)), leases.views
