"""The proxies as the CLI sees them: the PROXY stream folded into views, read once."""

from __future__ import annotations

from events.subjects import PROXY_STREAM
from projections.proxy import ProxyView, apply
from services.runtime.eventlog.projector import Projector
from services.runtime.nats.connection import Connection


async def projection(conn: Connection) -> Projector[ProxyView]:
    projector: Projector[ProxyView] = Projector(conn.js, PROXY_STREAM, "proxy.*.*", apply)
    await projector.catch_up()
    return projector


async def listed(conn: Connection, namespace: str | None) -> list[ProxyView]:
    """The proxies ``get`` lists: declared, not removed, by namespace and name."""
    projector = await projection(conn)
    await projector.close()
    views = [v for v in projector.views.values() if v.name and not v.removed]
    if namespace:
        views = [v for v in views if v.namespace == namespace]
    return sorted(views, key=lambda v: (v.namespace, v.name))
