"""The provider contract every provider implements, and its error taxonomy
(docs/architecture.md, The provider contract).

The reconciler decides from the error *class* alone, so every provider maps each failure of its
client library onto exactly one of NotFound, QuotaExceeded, Transient, Permanent, chaining the
original exception for the logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Protocol, runtime_checkable

from events.schemas import ErrorClass, InstanceState, ProxySpec

MANAGED_LABEL = "egress-proxies/managed"
OWNER_LABEL = "egress-proxies/owner-uid"
CREATED_AT_LABEL = "egress-proxies/created-at"
NAMESPACE_LABEL = "egress-proxies/namespace"
NAME_LABEL = "egress-proxies/name"
"""The proxy's namespace and name on its instance, for the operator in a cloud's console; never
read to decide (``services.providers.pure.identity``)."""
DEFAULT_PROXY_PORT = 3128


@dataclass(frozen=True, slots=True)
class LeaseAuth:
    """What an instance needs to enforce leases
    (docs/decisions/0084-leases-enforced-at-the-proxy.md): its proxy key (hex) and the source of the
    Squid helper that checks credentials with it. Kept out of ``repr``: requests are logged, and the
    key is a secret. ``fence_floor``: the fencing token the instance's helper starts fenced at
    (D92)."""

    key: str = field(repr=False)
    helper: str = field(repr=False)
    fence_floor: int = 0


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """Everything a provider needs to create one instance; ``name`` is deterministic, so a
    repeated create finds the instance the first attempt made."""

    name: str
    owner_uid: str
    namespace: str
    proxy_name: str
    spec: ProxySpec
    spec_hash: str = ""
    cloud_init: str = ""
    lease_auth: LeaseAuth | None = None
    """None: the instance serves without lease credentials (``auth: none``, or a test)."""
    fence_floor: int = 0
    """The proxy's highest granted fencing token when the executor asked for this instance: a
    new instance refuses every lease below it from its first request, so a re-created proxy
    does not let a fenced holder back in (docs/decisions/0092-nobody-who-reaches-a-proxy.md).
    Providers that enforce leases receive it in ``lease_auth``; 0: no lease granted yet."""


@dataclass(frozen=True, slots=True)
class Instance:
    provider_id: str
    name: str
    state: InstanceState
    owner_uid: str
    created_at: datetime
    ip: str = ""
    port: int = DEFAULT_PROXY_PORT
    instance_uid: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The proxy URL a client passes to ``curl -x``; empty until the instance has an IP. An
        IPv6 address is bracketed, as URLs need it."""
        if not self.ip:
            return ""
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


MAX_RETRY_AFTER = 3600.0
"""The longest wait a provider's answer may impose (a throttling reset header says how long):
a hostile or broken header cannot park a command for days."""


class ProviderError(Exception):
    """Base of the taxonomy; ``error_class`` is what the reconciler acts on.

    ``retry_after``: the seconds the cloud asked us to wait before the next call (HTTP 429's
    ``Retry-After`` or a rate limit's reset time), 0 when it did not say; the executor waits at
    least that long, at most ``MAX_RETRY_AFTER``. Non-finite or negative values read as 0."""

    error_class: ClassVar[ErrorClass]

    def __init__(self, *args: object, retry_after: float = 0.0) -> None:
        super().__init__(*args)
        finite = (
            not isinstance(retry_after, bool)
            and isinstance(retry_after, int | float)
            and 0.0 <= retry_after < float("inf")
        )
        self.retry_after = min(float(retry_after), MAX_RETRY_AFTER) if finite else 0.0


class NotFound(ProviderError):
    """A normal answer: the instance does not exist (any more)."""

    error_class = ErrorClass.NOT_FOUND


class QuotaExceeded(ProviderError):
    """The provider refuses for lack of quota or capacity: retry slowly, say why."""

    error_class = ErrorClass.QUOTA_EXCEEDED


class Transient(ProviderError):
    """Timeouts, 5xx, connection resets: retry with backoff."""

    error_class = ErrorClass.TRANSIENT


class Permanent(ProviderError):
    """Bad request, forbidden, invalid image: latch Failed until the spec changes."""

    error_class = ErrorClass.PERMANENT


class Provider(Protocol):
    """One named provider instance (``spec.provider`` names it, not its type)."""

    name: str
    type: str

    async def create(self, request: CreateRequest) -> str:
        """Submit the instance and return its provider id without waiting for it to run.
        Idempotent on ``request.name``: a second call returns the same id."""
        ...

    async def get(self, provider_id: str) -> Instance:
        """The instance now. Raises NotFound when it does not exist."""
        ...

    async def delete(self, provider_id: str) -> None:
        """Start deleting; deleting what is already gone is not an error."""
        ...

    async def list_by_tag(self) -> list[Instance]:
        """Every instance this provider instance manages (tagged managed + owner uid)."""
        ...

    async def close(self) -> None:
        """Release clients and connections."""
        ...


@dataclass(frozen=True, slots=True)
class Leftover:
    """Something a provider made for one instance that can outlive it: a VM's disk whose domain
    is gone, say. ``provider_id`` names it to ``delete_leftover`` (kvm:
    ``hosts/<host>/volumes/<pool>/<volume>``), ``created_at`` is when it last changed (the epoch
    when unknown, so it counts as old), ``kind`` says what it is (``volume``)."""

    provider_id: str
    owner_uid: str
    created_at: datetime
    kind: str


@runtime_checkable
class LeftoverCleaner(Protocol):
    """An optional capability of a provider, checked with ``isinstance``.

    Some providers make resources for an instance besides the instance itself (disks, seeds) and
    cannot make them vanish together: a delete cut off half-way, or a create cut off before the
    instance exists, leaves them behind. ``list_by_tag`` cannot report them, there being no
    instance, so nothing would ever delete them; this lets GC find them and judge them by the
    same rules as instances (owner uid and age)."""

    async def leftovers(self) -> list[Leftover]:
        """Every leftover whose instance does not exist. Fails as a whole (never a partial
        list) when a part of the provider cannot be read."""
        ...

    async def delete_leftover(self, leftover: Leftover) -> bool:
        """Delete one reported leftover. True when it is gone (already gone included); False
        when it was kept because it is in use again (its instance came back meanwhile)."""
        ...
