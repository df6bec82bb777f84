"""Stream definitions (docs/architecture.md, The event log) and their idempotent creation.

Creation never edits an existing stream: a stream someone configured differently is reported with
every difference, because silently changing retention or limits on an event log can lose history.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        elif name in ("deny_delete", "deny_purge", "allow_direct"):
            a, b = bool(a), bool(b)
        if a != b:
            diff[name] = (a, b)
    return diff


async def ensure_streams(js: JetStreamContext, replicas: int = 1) -> list[str]:
    """Create missing streams; return the names created. Raises on a mismatching one."""
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
        if diff:
            raise StreamConfigMismatch(spec.name, diff)
    return created
