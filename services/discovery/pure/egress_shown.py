"""A proxy's egress as the API, the console and the CLI show it: the finding about its current
instance, the other proxies on the same public address, and whether that keeps it from being
leased (docs/decisions/0111-verified-egress.md).

Every place asks the same two functions, so a proxy flagged on the fleet page is the one the API
calls ``notLeasableBecause`` and the CLI marks. The judgement itself is
``projections.egress.blocked``; this module only gathers what it needs (the policy, and who else
leaves through the address) and puts it in one shape. Pure: the caller passes the policy and the
index, or the views to build one from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime

import msgspec

from projections import egress
from projections.egress import MISMATCH, SHARED, UNCHECKED, EgressIndex, EgressPolicy
from projections.proxy import ProxyView

COUNTRY_UNKNOWN = "unknown"
"""The country of a proxy whose egress has no country seen (not checked, failed, private)."""
FLAGS = {MISMATCH: "mismatch", UNCHECKED: "unchecked", SHARED: "shared"}
"""The word a page shows for each reason a proxy is not leased for its egress."""
_COUNTRY = re.compile(r"^[A-Za-z]{2}\Z")
_ASN = re.compile(r"^(?:[Aa][Ss])?([0-9]{1,10})\Z")


class EgressShown(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What a site sees of one proxy, and what follows from it: the API's ``egress`` object as
    it is (``GET /v1/proxies``, a lease's proxy) and what the console and ``get`` show."""

    ip: str = ""
    scope: str = ""
    """``public``, or ``private`` when the echo answered from inside the proxy's network."""
    country: str = ""
    asn: int = 0
    org: str = ""
    db: str = ""
    error: str = ""
    """Why the last check found no address; with ``ip`` set, the earlier address stands."""
    checked_at: datetime | None = None
    """When the check that found this ran (a later check that confirms it records nothing)."""
    changed_from: str = ""
    """The address recorded before, when the instance's address changed under it."""
    shared: tuple[str, ...] = ()
    """The uids of the other proxies that leave through the same public address."""
    not_leasable_because: str = ""
    """``egress_mismatch``, ``egress_unchecked``, ``egress_shared``, or "" (leasable for it)."""
    seen: str = ""
    """What was seen that made it so, in words (or the clash, when it is only flagged)."""

    @property
    def asn_text(self) -> str:
        return f"AS{self.asn}" if self.asn else ""

    @property
    def place(self) -> str:
        """``DE/AS3320``; ``-`` for what is unknown (``-/-`` for nothing)."""
        return f"{self.country or '-'}/{self.asn_text or '-'}"

    @property
    def flag(self) -> str:
        """One word for a page: why it is not leased, else ``shared`` for a clash, else ""."""
        if self.not_leasable_because:
            return FLAGS.get(self.not_leasable_because, self.not_leasable_because)
        return FLAGS[SHARED] if self.shared else ""

    @property
    def country_key(self) -> str:
        """The country a filter or a metric files it under (``unknown`` for none)."""
        return self.country or COUNTRY_UNKNOWN


def shown(
    view: ProxyView, policy: EgressPolicy, sharing: Sequence[str] = (), later: bool = False
) -> EgressShown | None:
    """The proxy's egress, or None when there is nothing to show: no finding about its instance
    and nothing held against it. ``sharing``: the other proxies on its address; ``later``:
    another had the address first (``EgressIndex.sharing`` and ``.later``)."""
    found = egress.finding(view)
    reason, seen = egress.blocked(view, policy, later)
    if found is None and not reason:
        return None
    shared = tuple(sharing)
    if not seen and shared and found is not None:
        others = ", ".join(shared)
        seen = f"egress {found.ip} is shared with {len(shared)} other proxy(ies): {others}"
    if found is None:
        return EgressShown(shared=shared, not_leasable_because=reason, seen=seen)
    return EgressShown(
        ip=found.ip,
        scope=found.scope,
        country=found.country,
        asn=found.asn,
        org=found.org,
        db=found.db,
        error=found.error,
        checked_at=found.checked_at,
        changed_from=found.changed_from,
        shared=shared,
        not_leasable_because=reason,
        seen=seen,
    )


def shown_in(view: ProxyView, policy: EgressPolicy, index: EgressIndex) -> EgressShown | None:
    """``shown`` with the clash read from ``index`` (discovery's, or one ``index_of`` built)."""
    return shown(view, policy, index.sharing(view.uid), index.later(view.uid))


def index_of(views: Iterable[ProxyView]) -> EgressIndex:
    """Which of ``views`` leave through each address: for views folded apart from discovery's
    (a time travel, the CLI), which keeps no index of its own."""
    index = EgressIndex()
    for view in views:
        if not view.removed:
            index.put(view.uid, view)
    return index


def country_filter(value: str, field: str) -> str:
    """A country to filter on, upper case (``de`` -> ``DE``); ``unknown`` for none seen; "" for
    no filter. Raises ``ValueError`` naming ``field`` and the fix."""
    text = value.strip()
    if not text:
        return ""
    if text.lower() == COUNTRY_UNKNOWN:
        return COUNTRY_UNKNOWN
    if not _COUNTRY.match(text):
        raise ValueError(
            f"{field}: {text[:40]!r} is not a country; write an ISO 3166 alpha-2 code (DE), "
            f"or {COUNTRY_UNKNOWN} for proxies with none seen"
        )
    return text.upper()


def asn_filter(value: str, field: str) -> str:
    """An autonomous system to filter on, as the selector pairs carry it (``3320`` or
    ``as3320`` -> ``AS3320``). Raises ``ValueError`` naming ``field`` and the fix."""
    found = _ASN.match(value.strip())
    if found is None or not int(found.group(1)):
        raise ValueError(
            f"{field}: {value.strip()[:40]!r} is not an autonomous system; write AS3320 (or 3320)"
        )
    return f"AS{int(found.group(1))}"
