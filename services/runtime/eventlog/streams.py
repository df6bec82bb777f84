"""Stream definitions (docs/architecture.md, The event log) and their idempotent creation.

Creation never edits an existing stream's retention or limits: a stream someone configured
differently is reported with every difference, because silently changing them on an event log can
lose history. What loses nothing is made good in place (``IN_PLACE``): a stream of an earlier
version without atomic batches gets them, so that its writers append a decision in one batch
(docs/decisions/0165-a-decision-in-one-atomic-batch.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from events.errors import StreamConfigMismatch
from events.subjects import (
    DEADLETTER_STREAM,
    DEMAND_STREAM,
    GC_STREAM,
    LEASE_STREAM,
    METER_STREAM,
    POOL_STREAM,
    PROXY_STREAM,
    TRAFFIC_STREAM,
)

log = structlog.get_logger("egress.streams")
DAY = 86_400.0
GIB = 1024**3


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age: float = 0.0
    deny_delete: bool = True
    deny_purge: bool = True
    duplicate_window: float = 600.0
    description: str = ""
    max_bytes: int = -1
    """The stream's size at most (-1: no limit); beyond it the oldest messages go."""

    def config(self, replicas: int) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            description=self.description,
            subjects=list(self.subjects),
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=self.max_age,
            max_bytes=self.max_bytes,
            num_replicas=replicas,
            duplicate_window=self.duplicate_window,
            deny_delete=self.deny_delete,
            deny_purge=self.deny_purge,
            allow_direct=True,
            allow_atomic=True,
        )


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        PROXY_STREAM,
        ("proxy.*.*",),
        description="Proxy aggregates: declared, cmd, instance, health, status",
    ),
    StreamSpec(
        LEASE_STREAM,
        ("lease.*",),
        max_age=7 * DAY,
        description="Leases per proxy: acquired, released, reported, expired",
    ),
    StreamSpec(GC_STREAM, ("gc.*",), max_age=30 * DAY, description="Orphan sweeps per provider"),
    StreamSpec(
        POOL_STREAM,
        ("pool.*.*",),
        description="Proxy pools: declared, and the pool controller's decisions",
    ),
    StreamSpec(
        DEMAND_STREAM,
        ("demand.*",),
        max_age=1 * DAY,
        description="Lease requests naming a pool that discovery could not serve, per replica",
    ),
    StreamSpec(
        TRAFFIC_STREAM,
        ("traffic.*",),
        max_age=7 * DAY,
        max_bytes=2 * GIB,
        description="What the gateway relayed per client, proxy, lease and host, per interval",
    ),
    StreamSpec(
        METER_STREAM,
        ("meter.*",),
        max_age=3 * DAY,
        max_bytes=1 * GIB,
        description="Bytes through upstream providers' chaining proxies, per proxy and lease",
    ),
    StreamSpec(
        DEADLETTER_STREAM,
        ("deadletter.>",),
        deny_delete=False,
        deny_purge=False,
        description="Messages a consumer gave up on, with the reason",
    ),
)


def differences(have: StreamConfig, want: StreamConfig) -> dict[str, tuple[object, object]]:
    fields = (
        "subjects",
        "retention",
        "storage",
        "max_age",
        "max_bytes",
        "num_replicas",
        "duplicate_window",
        "deny_delete",
        "deny_purge",
        "allow_direct",
        "allow_atomic",
    )
    diff: dict[str, tuple[object, object]] = {}
    for name in fields:
        a, b = getattr(have, name), getattr(want, name)
        if name == "subjects":
            a, b = sorted(a or []), sorted(b or [])
        elif name in ("max_age", "duplicate_window"):
            a, b = float(a or 0), float(b or 0)
        elif name == "max_bytes":
            a, b = a if a and a > 0 else -1, b if b and b > 0 else -1
        elif name in ("deny_delete", "deny_purge", "allow_direct", "allow_atomic"):
            a, b = bool(a), bool(b)
        if a != b:
            diff[name] = (a, b)
    return diff


IN_PLACE = frozenset({"allow_atomic"})
"""Settings an existing stream is brought to as declared: turning them on loses nothing."""


async def ensure_streams(
    js: JetStreamContext, replicas: int = 1, updated: list[str] | None = None
) -> list[str]:
    """Create missing streams; return the names created, and add to ``updated`` those brought
    up to date in place (``IN_PLACE``). Raises on a mismatching one."""
    created: list[str] = []
    for spec in STREAMS:
        want = spec.config(replicas)
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            await js.add_stream(want)
            created.append(spec.name)
            continue
        diff = differences(info.config, want)
        if diff and set(diff) <= IN_PLACE:
            if await _update_in_place(js, info.config, want, diff) and updated is not None:
                updated.append(spec.name)
        elif diff:
            raise StreamConfigMismatch(spec.name, diff)
    return created


async def _update_in_place(
    js: JetStreamContext,
    have: StreamConfig,
    want: StreamConfig,
    diff: dict[str, tuple[object, object]],
) -> bool:
    """Turn on what ``diff`` names, leaving everything else of the stream as it is. A user not
    allowed to update streams (a service's own, docs/operations.md) or a server that does not
    know the setting leaves the stream as it was: its writers append one event at a time, which
    is what they did before, and ``streams init`` run by the administrator updates it."""
    config = replace(have, **{name: getattr(want, name) for name in diff})
    try:
        done = await js.update_stream(config)
    except (nats.errors.Error, TimeoutError) as exc:
        log.warning(
            "stream not updated in place; run `egress-proxies streams init` as the administrator",
            stream=have.name,
            settings=sorted(diff),
            error=str(exc),
        )
        return False
    if differences(done.config, want):
        log.info("the server keeps the stream as it was", stream=have.name, settings=sorted(diff))
        return False
    log.info("stream updated in place", stream=have.name, settings=sorted(diff))
    return True
