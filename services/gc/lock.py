"""Only one GC replica sweeps at a time: a ``KvLock`` (``services.runtime.kvlock``) in its own
bucket with a TTL.

Deletes are idempotent, so two sweeps at once would be harmless but wasteful (every provider
listed twice, every orphan deleted twice, every GC event doubled). A holder that dies mid-sweep
blocks the others for at most the TTL. The lock entry's JetStream timestamp doubles as the
sweep's clock: replicas with skewed clocks then agree on which instances are past the grace
(docs/architecture.md, The event log).
"""

from __future__ import annotations

from nats.js import JetStreamContext

from services.runtime.kvlock import Held, KvLock, LockValue, holder_id

__all__ = ["DEFAULT_TTL", "LOCK_BUCKET", "LOCK_KEY", "Held", "LockValue", "SweepLock", "holder_id"]

LOCK_BUCKET = "egress-gc-lock"
LOCK_KEY = "sweep"
DEFAULT_TTL = 120.0


class SweepLock(KvLock):
    def __init__(
        self,
        js: JetStreamContext,
        *,
        ttl: float = DEFAULT_TTL,
        bucket: str = LOCK_BUCKET,
        key: str = LOCK_KEY,
        holder: str | None = None,
    ) -> None:
        super().__init__(
            js,
            bucket=bucket,
            key=key,
            ttl=ttl,
            holder=holder,
            description="egress-proxies: which GC replica is sweeping",
        )
