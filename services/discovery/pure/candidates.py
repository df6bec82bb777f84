"""Which proxies a lease request may get, found without scanning the fleet on every request.

A lease request used to test every proxy against the selector and shuffle them all: with 64
proxies that was a sixth of a lease's CPU, and it grows with the fleet. The index keeps the
leasable proxies (Ready, found healthy, not being deleted) and, for each attribute
pair, which of them carry it, so a selector is a set intersection; it changes only when a proxy
event arrives. Whether a candidate is free is a question of time (a lease or a cooldown ends
with no event), so that is asked per candidate, in random order, drawn lazily: finding one free
proxy among thousands does not shuffle the thousands.

A proxy's egress (docs/decisions/0111-verified-egress.md) is part of both: what was seen is
selectable as ``egress.country`` and ``egress.asn`` pairs, and a finding that does not match, or
a later proxy on a shared address under ``--unique-egress``, keeps it out of the leasable index.
A change of one proxy's address can end or start another's clash, so those are indexed again.

A second index holds every proxy that exists (declared and not removed), leasable or not, so a
request that gets no proxy learns the truth: nothing has those attributes (its selector is
wrong), or some proxies have them but none can be leased now (it should wait). With the same
proxies filed by phase and by health, it answers ``GET /v1/proxies``'s filters as an
intersection too, so a filtered listing's ``total`` is not a walk of the fleet
(docs/decisions/0164-a-change-index-for-the-fleet-poll.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping
from collections.abc import Set as AbstractSet
from typing import Generic, TypeVar

from projections import egress
from projections.egress import NO_POLICY, EgressIndex, EgressPolicy
from projections.lease_queries import leasable
from projections.proxy import ProxyView
from services.discovery.pure.drawing import Candidates, Drawable
from services.discovery.pure.egress_shown import asn_filter, country_filter

EGRESS_COUNTRY = "egress.country"
EGRESS_ASN = "egress.asn"


def egress_pairs(proxy: ProxyView) -> frozenset[tuple[str, str]]:
    """What was seen of the proxy's egress, as selector pairs (``egress.asn`` as ``AS3320``)."""
    found = egress.finding(proxy)
    if found is None or not found.ip:
        return frozenset()
    pairs = set()
    if found.country:
        pairs.add((EGRESS_COUNTRY, found.country))
    if found.asn:
        pairs.add((EGRESS_ASN, f"AS{found.asn}"))
    return frozenset(pairs)


def normalized(selector: Mapping[str, str]) -> Mapping[str, str]:
    """A selector whose egress pairs are written as the index holds them, as the proxy list's
    filters write them (``egress_shown``): ``de`` as ``DE``, ``3320`` or ``as3320`` as
    ``AS3320``. A value that names no country or network is left as it is: it matches nothing,
    and the refusal names what exists. Attributes stay exact."""
    if EGRESS_COUNTRY not in selector and EGRESS_ASN not in selector:
        return selector
    out = dict(selector)
    for key, canonical in ((EGRESS_COUNTRY, country_filter), (EGRESS_ASN, asn_filter)):
        if key in out:
            with contextlib.suppress(ValueError):
                out[key] = canonical(out[key], key) or out[key]
    return out


def pairs_of(proxy: ProxyView) -> frozenset[tuple[str, str]]:
    """The pairs a selector is matched against: the attributes and the egress seen."""
    return frozenset(proxy.spec.attributes.items()) | egress_pairs(proxy)


NOBODY: frozenset[str] = frozenset()
NO_HOLDERS = Drawable()
"""The holders of a pair nobody carries: empty, and never added to."""


H = TypeVar("H", set[str], Drawable)


class PairIndex(Generic[H]):
    """uid -> attribute pairs, and pair -> uids (``holders``: sets, or ``Drawable``s where a
    request draws from them), for one set of proxies."""

    def __init__(self, holders: Callable[[], H]) -> None:
        self.pairs: dict[str, frozenset[tuple[str, str]]] = {}
        self.by_pair: dict[tuple[str, str], H] = {}
        self._holders: Callable[[], H] = holders

    def put(self, uid: str, pairs: frozenset[tuple[str, str]] | None) -> None:
        """Index ``uid`` with ``pairs``, or drop it (None)."""
        for pair in self.pairs.pop(uid, None) or ():
            holders = self.by_pair[pair]
            holders.discard(uid)
            if not holders:
                del self.by_pair[pair]
        if pairs is None:
            return
        self.pairs[uid] = pairs
        for pair in pairs:
            found = self.by_pair.get(pair)
            if found is None:
                found = self.by_pair[pair] = self._holders()
            found.add(uid)

    def matching(self, selector: Mapping[str, str]) -> list[str]:
        if not selector:
            return list(self.pairs)
        sets = sorted((self.by_pair.get(pair, NOBODY) for pair in selector.items()), key=len)
        found = set(sets[0]).intersection(*sets[1:])
        return sorted(found)  # a stable order, for the listings and the refusals


class LeasableIndex(PairIndex[Drawable]):
    """The leasable proxies, whose members and pair holders are ``Drawable``s: a request draws
    from them in place (``to_draw``) instead of copying them."""

    def __init__(self) -> None:
        super().__init__(Drawable)
        self.members = Drawable()

    def put(self, uid: str, pairs: frozenset[tuple[str, str]] | None) -> None:
        super().put(uid, pairs)
        if pairs is None:
            self.members.discard(uid)
        else:
            self.members.add(uid)

    def to_draw(self, selector: Mapping[str, str]) -> Candidates:
        """The live members, or the live holders of the selector's rarest pair with each drawn
        uid tested for the other pairs: nothing copied or sorted, so a draw costs the uids it
        draws, not the fleet (``drawing``)."""
        if not selector:
            return Candidates(self.members)
        holders = sorted((self.by_pair.get(pair, NO_HOLDERS) for pair in selector.items()), key=len)
        rarest, rest = holders[0], holders[1:]
        if not rest:
            return Candidates(rarest)
        return Candidates(rarest, lambda uid: all(uid in other for other in rest))

    def has(self, uid: str, selector: Mapping[str, str]) -> bool:
        """Whether ``uid`` is a member carrying every selector pair: one proxy, not the set."""
        pairs = self.pairs.get(uid)
        return pairs is not None and all(pair in pairs for pair in selector.items())


V = TypeVar("V")


class ValueIndex(Generic[V]):
    """uid -> one value of it, and value -> the uids that have it."""

    def __init__(self) -> None:
        self.value_of: dict[str, V] = {}
        self.uids: dict[V, set[str]] = {}

    def put(self, uid: str, value: V) -> None:
        self.drop(uid)
        self.value_of[uid] = value
        self.uids.setdefault(value, set()).add(uid)

    def drop(self, uid: str) -> None:
        if uid not in self.value_of:
            return
        old = self.value_of.pop(uid)
        holders = self.uids[old]
        holders.discard(uid)
        if not holders:
            del self.uids[old]


class CandidateIndex:
    def __init__(self, policy: EgressPolicy = NO_POLICY) -> None:
        self.policy = policy
        self.egress = EgressIndex()
        self._leasable = LeasableIndex()
        self._existing: PairIndex[set[str]] = PairIndex(set)
        self._views: dict[str, ProxyView] = {}
        self.phases: ValueIndex[str] = ValueIndex()
        """The proxies not removed, by phase."""
        self.healths: ValueIndex[bool | None] = ValueIndex()
        """The proxies not removed, by their last verdict (None: not probed yet)."""

    @property
    def leasable(self) -> dict[str, frozenset[tuple[str, str]]]:
        """uid -> its attribute pairs, for every leasable proxy."""
        return self._leasable.pairs

    @property
    def by_pair(self) -> dict[tuple[str, str], Drawable]:
        return self._leasable.by_pair

    def update(self, proxy: ProxyView) -> set[str]:
        """Called with every new version of a proxy's view; the uids whose egress may have
        changed with it (``proxy``'s and those on its old and new address)."""
        pairs = pairs_of(proxy)
        self._existing.put(proxy.uid, None if proxy.removed else pairs)
        if proxy.removed:
            self._views.pop(proxy.uid, None)
            self.phases.drop(proxy.uid)
            self.healths.drop(proxy.uid)
        else:
            self._views[proxy.uid] = proxy
            self.phases.put(proxy.uid, proxy.phase.value)
            self.healths.put(proxy.uid, proxy.healthy)
        touched = self.egress.put(proxy.uid, proxy)
        for uid in touched:
            view = proxy if uid == proxy.uid else self._views.get(uid)
            if view is not None:
                self._leasable.put(uid, pairs_of(view) if self.admits(view) else None)
        return touched

    def admits(self, proxy: ProxyView) -> bool:
        """Leasable (``lease_queries.leasable``) and not held back by its egress."""
        return leasable(proxy) and not self.egress_blocked(proxy)[0]

    def egress_blocked(self, proxy: ProxyView) -> tuple[str, str]:
        """Why its egress keeps the proxy from being leased, and what was seen; ("", "")."""
        return egress.blocked(proxy, self.policy, self.egress.later(proxy.uid))

    def matching(self, selector: Mapping[str, str]) -> list[str]:
        """Leasable proxies whose attributes include every selector pair."""
        return self._leasable.matching(normalized(selector))

    def to_draw(self, selector: Mapping[str, str], only: str | None = None) -> Candidates:
        """The leasable proxies an acquire draws from (``PairIndex.to_draw``), and for a
        request of one proxy (``only``) that proxy if it matches."""
        wanted = normalized(selector)
        if only is not None:
            return Candidates([only] if self._leasable.has(only, wanted) else [])
        return self._leasable.to_draw(wanted)

    def existing(self, selector: Mapping[str, str]) -> list[str]:
        """Proxies not removed whose attributes include every selector pair, leasable or not."""
        return self._existing.matching(normalized(selector))

    def filtered(
        self, phase: str | None, healthy: bool | None, pairs: Collection[tuple[str, str]]
    ) -> AbstractSet[str]:
        """The proxies not removed in ``phase`` (None: any), of verdict ``healthy`` (None: any)
        and carrying every pair (attributes and egress pairs, as ``pairs_of``): an intersection
        that costs the smallest of its sets, not the fleet. Not to be changed."""
        sets: list[AbstractSet[str]] = []
        if phase is not None:
            sets.append(self.phases.uids.get(phase, NOBODY))
        if healthy is not None:
            sets.append(self.healths.uids.get(healthy, NOBODY))
        sets += [self._existing.by_pair.get(pair, NOBODY) for pair in pairs]
        if not sets:
            return self._existing.pairs.keys()
        sets.sort(key=len)
        return sets[0] if len(sets) == 1 else set(sets[0]).intersection(*sets[1:])

    def attribute_values(self) -> dict[str, set[str]]:
        """Every attribute key the existing proxies carry, with the values seen for it."""
        values: dict[str, set[str]] = {}
        for key, value in self._existing.by_pair:
            values.setdefault(key, set()).add(value)
        return values
