"""The events of make-before-break rotation: a fresh instance for a proxy without downtime
(docs/decisions/0085-a-fresh-ip-without-downtime.md). ``proxy.<uid>.rotate`` holds the requests: a
subject of its own, so that discovery, which writes them, may write nothing the reconciler takes as
a declaration. The rest go on the proxy's ``status`` subject; the lease's switch (``LeaseSwitched``)
is a lease event, in
``events.lease``.

Part of the one tagged union ``events.schemas`` defines (and re-exports these from); the rules
there (new fields take defaults) hold here. See docs/architecture.md, The event log.
"""

from __future__ import annotations

from typing import ClassVar

from events.base import Event


class RotationRequested(Event, frozen=True, kw_only=True):
    """Someone asked for a fresh instance (a fresh IP) of the proxy, without downtime: a
    replacement is made first, the proxy and its lease switch to it once it is Ready and probed
    healthy, and only then is the old instance deleted. A request while a rotation is under way
    changes nothing (the API answers with the rotation under way)."""

    category: ClassVar[str] = "rotate"
    uid: str
    rotation_id: str
    lease_id: str = ""
    """The lease whose holder asked (``POST /v1/leases/{id}/rotate``); "" for anyone else."""
    client: str = ""
    """The API client that asked (as on ``LeaseAcquired``); "" for anyone else."""
    reason: str = ""
    """Why, when the system asked on its own: ``EgressMismatch`` (``events.egress``); "" for a
    request someone made."""


class ReplacementStarted(Event, frozen=True, kw_only=True):
    """The reconciler begins a make-before-break replacement: the ``CreateInstance`` with
    ``command_id`` makes the replacement, and its answers are about it, not about the proxy's
    current instance."""

    category: ClassVar[str] = "status"
    rotation_id: str
    command_id: str
    reason: str = "Requested"
    """``Requested`` (a ``RotationRequested``) or ``SpecChanged`` (a leased proxy's new spec)."""
    lease_id: str = ""


class ReplacementPromoted(Event, frozen=True, kw_only=True):
    """The replacement, Ready and healthy, is now the proxy's instance; the one it replaces
    (``retired_provider_id``) is deleted after the reconciler's drain time, once the proxy's
    lease has switched (``LeaseSwitched``)."""

    category: ClassVar[str] = "status"
    rotation_id: str
    provider_id: str
    retired_provider_id: str = ""
    ip: str = ""
    url: str = ""


class RotationEnded(Event, frozen=True, kw_only=True):
    """A rotation given up before its switch: its replacement failed, stopped, vanished or was
    judged unhealthy (``failed``), or the proxy's spec changed or it is being deleted
    (``cancelled``). The proxy keeps its instance; the replacement, if any, is deleted."""

    category: ClassVar[str] = "status"
    rotation_id: str
    outcome: str = "failed"
    message: str = ""
