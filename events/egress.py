"""The events of verified egress: what a site sees of a proxy (its public address, country and
network), as the health service finds it through the proxy (docs/architecture.md, "Verified
egress"; docs/decisions/0111-verified-egress.md).

They go on ``proxy.<uid>.egress``, a subject of their own: the reconciler and the executor do not
read it, and a reader that wants only them reads one literal subject per proxy. Only a new
finding is appended (the first check of an instance, a changed address or place, a check that
starts or stops failing, a newer database): a check that confirms the last finding appends
nothing, so the log grows with changes, not with time.

Part of the one tagged union ``events.schemas`` defines (and re-exports these from); new fields
take defaults.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from events.base import Event

EGRESS_MISMATCH = "EgressMismatch"
"""The ``reason`` of a ``RotationRequested`` asked for because the egress did not match the
proxy's expectation (``spec.egress.onMismatch: replace``)."""


class EgressObserved(Event, frozen=True, kw_only=True):
    """What the echo URL, fetched through the instance ``provider_id``, answered, and where the
    offline database places that address. A failed check has ``error`` and no ``ip``."""

    category: ClassVar[str] = "egress"
    provider_id: str
    ip: str = ""
    scope: str = ""
    """``public``, or ``private`` for an address no site would see (a loopback or private
    network answered: the echo runs inside the proxy's network)."""
    country: str = ""
    """ISO 3166 alpha-2, upper case; "" unknown."""
    asn: int = 0
    """The autonomous system's number; 0 unknown (the bundled data has names only)."""
    org: str = ""
    """The autonomous system's organisation."""
    db: str = ""
    """Which database placed the address, with its date."""
    error: str = ""
    """Why the check found no address (the echo's answer, a timeout), with the fix."""
    checked_at: datetime | None = None


class EgressChanged(EgressObserved, frozen=True, kw_only=True):
    """The instance now leaves through another address than the one last recorded for it: a
    NAT or a VM's address changed under a running crawl. Carries the new finding, and the old."""

    old_ip: str = ""
    old_country: str = ""
    old_asn: int = 0
