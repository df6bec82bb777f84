"""``get --at`` and ``events --until``: the log as it was at an instant (docs/console.md).

The views are folded up to the instant with the services' own folds, from the nearest
checkpoint before it (``services.runtime.eventlog.checkpoints``), so the answer is what ``get``
would have printed then, leases judged at that instant too. It costs decoding the checkpoints and
folding what came after them; where there is none, a replay of the log up to then.
"""

from __future__ import annotations

from datetime import UTC, datetime

import click

from projections.lease import LeaseView
from projections.proxy import ProxyView
from services.runtime.eventlog import checkpoints
from services.runtime.eventlog.asof import parse_instant
from services.runtime.eventlog.checkpoints import fold_at
from services.runtime.nats.connection import Connection


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
    proxies = await fold_at(conn.js, checkpoints.PROXY, at)
    leases = await fold_at(conn.js, checkpoints.LEASE, at)
    views = [v for v in proxies.views.values() if v.name and not v.removed]
    if namespace:
        views = [v for v in views if v.namespace == namespace]
    return sorted(views, key=lambda v: (v.namespace, v.name)), leases.views
