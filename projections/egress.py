"""What a proxy's egress is and whether it may be leased for it: the findings the proxy view
keeps, the expectation they are held to, and the index of proxies that leave through one
address (docs/decisions/0111-verified-egress.md).

Pure: the policy (``EgressPolicy``) is the caller's (discovery's and the health service's
settings), the findings are the log's, and nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import msgspec

from events.egress import EgressChanged, EgressObserved

if TYPE_CHECKING:
    from projections.proxy import ProxyView

KEPT = 2
"""Findings a view keeps: its instance's and a rotation's replacement's."""

MISMATCH = "egress_mismatch"
UNCHECKED = "egress_unchecked"
SHARED = "egress_shared"
REASONS = (MISMATCH, UNCHECKED, SHARED)
"""Why egress keeps a proxy from being leased (the 503's ``reasons`` keys)."""


class Egress(msgspec.Struct, frozen=True, kw_only=True):
    """The last finding about one instance's egress."""

    provider_id: str
    ip: str = ""
    scope: str = ""
    country: str = ""
    asn: int = 0
    org: str = ""
    db: str = ""
    error: str = ""
    checked_at: datetime | None = None
    """When the check that found this ran (a later check that found the same appends nothing)."""
    seq: int = 0
    """The stream sequence that recorded it: of two proxies on one address, the later is the one
    with the higher sequence."""
    changed_from: str = ""
    """The address recorded before, when this finding was a change of address."""


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """The settings that judge a finding: discovery's and the health service's
    (``--egress-country-attribute``, ``--egress-required``, ``--unique-egress``)."""

    country_attribute: str = ""
    required: bool = False
    unique: bool = False


NO_POLICY = EgressPolicy()


def record(found: tuple[Egress, ...], event: EgressObserved, seq: int) -> tuple[Egress, ...]:
    """The findings after ``event``: its instance's replaced, the newest last, ``KEPT`` at most."""
    changed_from = event.old_ip if isinstance(event, EgressChanged) else ""
    new = Egress(
        provider_id=event.provider_id,
        ip=event.ip,
        scope=event.scope,
        country=event.country,
        asn=event.asn,
        org=event.org,
        db=event.db,
        error=event.error,
        checked_at=event.checked_at,
        seq=seq,
        changed_from=changed_from,
    )
    prior = next((e for e in found if e.provider_id == event.provider_id), None)
    if prior is not None and prior.ip and event.error and not event.ip:
        # A check that failed after one that found an address: the address stands (whether the
        # proxy forwards at all is the health probe's to judge), with why it is not fresh.
        new = msgspec.structs.replace(prior, error=event.error, seq=prior.seq)
    kept = tuple(e for e in found if e.provider_id != event.provider_id)
    return (*kept, new)[-KEPT:]


def finding(view: ProxyView, provider_id: str | None = None) -> Egress | None:
    """The last finding about ``provider_id`` (the view's instance by default)."""
    wanted = view.provider_id if provider_id is None else provider_id
    if not wanted:
        return None
    return next((e for e in reversed(view.egress) if e.provider_id == wanted), None)


def expected_country(view: ProxyView, policy: EgressPolicy) -> tuple[str, str]:
    """The country the proxy must leave from, upper case, and the field that says so."""
    if view.spec.egress_rules.expect.country:
        return view.spec.egress_rules.expect.country.upper(), "spec.egress.expect.country"
    if policy.country_attribute:
        value = view.spec.attributes.get(policy.country_attribute, "")
        if value:
            return value.upper(), f"spec.attributes.{policy.country_attribute}"
    return "", ""


def expects(view: ProxyView, policy: EgressPolicy) -> bool:
    return bool(expected_country(view, policy)[0] or view.spec.egress_rules.expect.asn)


def mismatch(view: ProxyView, found: Egress | None, policy: EgressPolicy) -> str:
    """Why ``found`` does not match what the proxy expects, or "" when it does (or expects
    nothing, or nothing was found yet)."""
    if found is None or not found.ip:
        return ""  # a failed check after a good one is judged on the address it had
    wrong: list[str] = []
    country, field = expected_country(view, policy)
    if country and found.country != country:
        seen = found.country or (
            "unknown (a private address)" if found.scope == "private" else "unknown"
        )
        wrong.append(f"country {seen}, expected {country} ({field})")
    asns = view.spec.egress_rules.expect.asn
    if asns and found.asn not in asns:
        seen = f"AS{found.asn}" if found.asn else "an unknown AS (give --geoip-db an ASN database)"
        listed = ", ".join(f"AS{n}" for n in asns)
        wrong.append(f"{seen}, expected one of {listed} (spec.egress.expect.asn)")
    if not wrong:
        return ""
    return f"egress {found.ip}: " + "; ".join(wrong)


def blocked(view: ProxyView, policy: EgressPolicy, shared_later: bool = False) -> tuple[str, str]:
    """Whether egress keeps the proxy from being leased: (reason, what was seen), or ("", "").

    A proxy not checked yet is held back only when ``policy.required`` (or when it expects an
    egress: a promise it makes cannot be kept unseen); a failed check keeps the last good
    finding's verdict; a later proxy on a shared address only with ``policy.unique``."""
    found = finding(view)
    if found is None or (found.error and not found.ip):
        if policy.required or expects(view, policy):
            why = found.error if found is not None else "no check has finished yet"
            return UNCHECKED, f"egress not verified: {why}"
        return "", ""
    wrong = mismatch(view, found, policy)
    if wrong:
        return MISMATCH, wrong
    if policy.unique and shared_later:
        return SHARED, f"egress {found.ip} is shared with another proxy that had it first"
    return "", ""


class EgressIndex:
    """Which proxies leave through each address (their instance's finding), and since when: the
    clash the health service flags and ``--unique-egress`` acts on."""

    def __init__(self) -> None:
        self.by_ip: dict[str, dict[str, int]] = {}
        self.ip_of: dict[str, str] = {}

    def put(self, uid: str, view: ProxyView | None) -> set[str]:
        """Index ``uid``'s current address (None or a removed view: drop it); returns the uids
        whose clash may have changed (those on its old and its new address)."""
        found = finding(view) if view is not None and not view.removed else None
        ip = found.ip if found is not None and found.ip and found.scope != "private" else ""
        touched: set[str] = {uid}
        old = self.ip_of.pop(uid, "")
        if old:
            holders = self.by_ip[old]
            holders.pop(uid, None)
            touched |= set(holders)
            if not holders:
                del self.by_ip[old]
        if ip and found is not None:
            holders = self.by_ip.setdefault(ip, {})
            holders[uid] = found.seq
            self.ip_of[uid] = ip
            touched |= set(holders)
        return touched

    def sharing(self, uid: str) -> list[str]:
        """The other proxies on ``uid``'s address."""
        ip = self.ip_of.get(uid, "")
        return sorted(u for u in self.by_ip.get(ip, {}) if u != uid) if ip else []

    def later(self, uid: str) -> bool:
        """Whether another proxy had ``uid``'s address first (ties: the smaller uid)."""
        ip = self.ip_of.get(uid, "")
        if not ip:
            return False
        holders = self.by_ip[ip]
        mine = (holders[uid], uid)
        return any((seq, other) < mine for other, seq in holders.items() if other != uid)

    def shared(self) -> dict[str, list[str]]:
        """Every address more than one proxy leaves through, with those proxies."""
        return {ip: sorted(h) for ip, h in self.by_ip.items() if len(h) > 1}
