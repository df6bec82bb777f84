"""The events of the lease stream (``lease.<proxy-uid>``): claims on a proxy and what befalls them.

Part of the one tagged union ``events.schemas`` defines (and re-exports these from); the rules
there (new fields take defaults) hold here. See docs/architecture.md, The event log.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

import msgspec

from events.base import Event

MAX_LEASE_SECONDS = 7 * 24 * 3600.0
"""The longest lease: the LEASE stream keeps events 7 days, and a lease that outlived its own
``LeaseAcquired`` would vanish from a rebuilt view while its holder still used the proxy."""
MAX_COOLDOWN_SECONDS = 24 * 3600.0
"""The longest rest after a lease; a longer one takes a proxy out of service, which is not what
a cooldown is for (delete the proxy instead)."""
MAX_TARGET_LENGTH = 253
"""A target is a host name (``projections.outcomes.target_key``): at most 253 characters."""
MAX_BLOCK_BACKOFF_SECONDS = 24 * 3600.0
"""The longest back-off a ``blocked`` report starts for a (proxy, target) pair, however often the
target blocked it: a site's block list changes, and a day is long enough to learn it has not."""


class LeaseAcquired(Event, frozen=True, kw_only=True):
    """A claim on the proxy; the lease fold decides whether it holds (it does not while another
    lease is active or the proxy cools down, judged by this event's JetStream timestamp)."""

    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    holder: str = ""
    ttl_seconds: float
    selector: dict[str, str] = msgspec.field(default_factory=dict)
    fencing_token: int = 0
    """The writer's information only (the previous token + 1, as its view saw it). The token the
    lease carries is the fold's: this event's stream sequence, never less than the previous
    token + 1 (docs/decisions/0080-fencing-tokens-are-the-grant-s.md)."""
    cooldown_seconds: float = 0.0
    """The cooldown that follows if this lease ends by expiry rather than release."""
    requested_ttl_seconds: float = 0.0
    """What the client asked for (0: nothing, the default applied); more than ``ttl_seconds``
    when the server's maximum lease TTL clamped it."""
    deadline: datetime | msgspec.UnsetType = msgspec.UNSET
    """When the writer stopped waiting for the log: its idea of the server's time plus its append
    timeout and a margin. A claim stamped later was answered as failed, so the fold ignores it
    (docs/api.md, "When NATS is unreachable"). Unset (left out of the payload): no deadline."""
    client: str = ""
    """The API client that wrote it (its name in the clients file, docs/api.md "Clients"); ""
    when the API had no clients configured, and in events written before clients existed."""
    target: str = ""
    """The host the holder means to reach (``projections.outcomes.target_key`` of what it
    sent); the claim does not hold while that host has the proxy in back-off. Empty: any."""


class LeaseReleased(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    cooldown_seconds: float = 0.0
    deadline: datetime | msgspec.UnsetType = msgspec.UNSET
    """As on ``LeaseAcquired``: a release stamped after it changes nothing."""
    client: str = ""
    """As on ``LeaseAcquired``: who released it ("" for the system's own releases)."""
    withdrawn: bool = False
    """Written by the system, not the holder: the claim's requester had been told it failed
    (its acknowledgement was lost in an outage), so nobody holds the lease."""
    reason: str = ""
    """Written by the system, not the holder: why it ended the lease under its holder.
    ``proxy_deleted`` (the proxy is being deleted: ``delete proxy``, its pool's scale-down or
    deletion) or ``left_pool`` (the proxy no longer carries the pool the lease was granted
    from). "" for a holder's release and a withdrawn claim
    (docs/decisions/0139-the-discovery-api-s-edges.md)."""


class LeaseReported(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    outcome: str
    """``success``, ``blocked`` or ``failed`` (the API accepts nothing else)."""
    detail: str = ""
    target: str = ""
    """What the holder was reaching through the proxy (a host or URL), when it said."""
    deadline: datetime | msgspec.UnsetType = msgspec.UNSET
    """As on ``LeaseAcquired``: a report stamped after it is not recorded in the view."""
    client: str = ""
    """As on ``LeaseAcquired``: who reported."""
    backoff_seconds: float = 0.0
    """The writer's ``--block-backoff``: how long a first ``blocked`` report for (proxy, target)
    keeps the proxy from that target; each further one doubles it, up to
    ``MAX_BLOCK_BACKOFF_SECONDS``. Carried in the event so that every replica, and a rebuild,
    computes the same back-off. 0 (and every report written before back-offs): none."""


class LeaseExpired(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str


class LeaseRenewed(Event, frozen=True, kw_only=True):
    """The holder asked for more time: the lease now ends ``ttl_seconds`` after this event's
    JetStream timestamp (the log's time, like every lease time), never later than
    ``MAX_LEASE_SECONDS`` after it was acquired. The fold counts it only while the lease is
    current and not past its end at that timestamp; the fencing token stays (D78)."""

    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    ttl_seconds: float
    requested_ttl_seconds: float = 0.0
    """What the client asked for; more than ``ttl_seconds`` when the server clamped it."""
    client: str = ""
    """As on ``LeaseAcquired``: who renewed it."""
    deadline: datetime | msgspec.UnsetType = msgspec.UNSET
    """As on ``LeaseAcquired``: a renewal stamped after it changes nothing."""


class LeaseSwitched(Event, frozen=True, kw_only=True):
    """The lease now goes through the proxy's new instance (a rotation's replacement). The
    lease's fencing token becomes this event's stream sequence (at least the previous token
    + 1), as a grant's does (D80): whatever downstream fences on it learns the lease moved."""

    category: ClassVar[str] = "lease"
    lease_id: str
    proxy_uid: str
    rotation_id: str
    provider_id: str
    ip: str = ""
