"""geoip2fast's bundled networks as flat arrays, and the lookup over them
(services/health/geoip.py).

Why: geoip2fast keeps its networks as lists of Python ints, which cost a process about 108 MB
(`up` went from 80 MB to 215 MB at its first egress check). The same networks as arrays of
machine integers cost a tenth of that. ``services.health.geoip_tables`` loads geoip2fast in a
child process, turns its lists into a ``Tables`` here, and hands the encoded tables to the
service, which never holds the lists.

Each network is its first address (32 bits for the networks geoip2fast keys below 2^32, two
64-bit halves for the others), its prefix length, and its country (an index into
``countries``, ``"CC:Name"``; the first 16 are geoip2fast's private and reserved ranges) or its
AS (an index into ``asn_names``). An address belongs to the last network of its family starting
at or below it when it is within that network's size (IPv4 sizes for an address up to 2^32, as
geoip2fast counts).

Pure: no I/O. ``build`` trusts only the shape it checks; ``Lookup`` never raises for any int.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

PRIVATE_CODES = 16
"""geoip2fast's first country indexes: private, reserved and special-use ranges."""
MAX_IPV4 = 2**32
HALF = 2**64


class Family(msgspec.Struct, frozen=True, kw_only=True):
    """The networks of one table whose first addresses fit in 32 bits (``wide`` False: one
    ``I`` each) or not (two ``Q`` halves each), with their prefix lengths and values."""

    wide: bool
    first: bytes = b""
    """``I`` per network, or the high halves (``Q``) when ``wide``."""
    first_lo: bytes = b""
    """The low halves (``Q``) when ``wide``."""
    netlen: bytes = b""
    value: bytes = b""
    """``H`` (a country index) or ``I`` (an AS index), as the table's ``code`` says."""


class Tables(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    countries: list[str]
    country_v4: Family
    country_v6: Family
    asn_names: list[str] = []
    asn_v4: Family = Family(wide=False)
    asn_v6: Family = Family(wide=True)


def _flat(chunks: Sequence[Sequence[int]]) -> list[int]:
    return [value for chunk in chunks for value in chunk]


def _families(
    firsts: Sequence[int], netlens: Sequence[int], values: Sequence[int], code: Literal["H", "I"]
) -> tuple[Family, Family]:
    """Split at 2^32: geoip2fast keys both families by one int, so an IPv4 network starts below
    2^32 and an address below it is looked up among them (as geoip2fast does)."""
    cut = bisect.bisect_left(firsts, MAX_IPV4)
    narrow = Family(
        wide=False,
        first=array("I", firsts[:cut]).tobytes(),
        netlen=array("B", netlens[:cut]).tobytes(),
        value=array(code, values[:cut]).tobytes(),
    )
    wide = Family(
        wide=True,
        first=array("Q", (f >> 64 for f in firsts[cut:])).tobytes(),
        first_lo=array("Q", (f & (HALF - 1) for f in firsts[cut:])).tobytes(),
        netlen=array("B", netlens[cut:]).tobytes(),
        value=array(code, values[cut:]).tobytes(),
    )
    return narrow, wide


def build(
    *,
    source: str,
    countries: Sequence[str],
    first: Sequence[Sequence[int]],
    netlen: Sequence[Sequence[int]],
    country: Sequence[Sequence[int]],
    asn_names: Sequence[str] = (),
    asn_first: Sequence[Sequence[int]] = (),
    asn_netlen: Sequence[Sequence[int]] = (),
    asn_id: Sequence[Sequence[int]] = (),
) -> Tables:
    """The tables of geoip2fast's chunked lists (its ``mainListFirstIP`` and the lists beside
    it, chunk by chunk). Raises ValueError when the lists do not line up or are not sorted."""
    firsts, asn_firsts = _flat(first), _flat(asn_first)
    netlens, values = _flat(netlen), _flat(country)
    asn_netlens, asn_values = _flat(asn_netlen), _flat(asn_id)
    for name, got, want in (
        ("netlen", netlens, len(firsts)),
        ("country", values, len(firsts)),
        ("asn_netlen", asn_netlens, len(asn_firsts)),
        ("asn_id", asn_values, len(asn_firsts)),
    ):
        if len(got) != want:
            raise ValueError(f"{name}: {len(got)} values for {want} networks")
    for name, got in (("first", firsts), ("asn_first", asn_firsts)):
        if any(b < a for a, b in itertools.pairwise(got)):
            raise ValueError(f"{name}: the networks are not in order")
        if got and not 0 <= got[0] <= got[-1] < 2**128:
            raise ValueError(f"{name}: an address outside 0..2^128")
    country_v4, country_v6 = _families(firsts, netlens, values, "H")
    asn_v4, asn_v6 = _families(asn_firsts, asn_netlens, asn_values, "I")
    return Tables(
        source=source,
        countries=list(countries),
        country_v4=country_v4,
        country_v6=country_v6,
        asn_names=list(asn_names),
        asn_v4=asn_v4,
        asn_v6=asn_v6,
    )


@dataclass(frozen=True, slots=True)
class Found:
    country: str = ""
    """ISO code as geoip2fast writes it ("" unknown)."""
    private: bool = False
    org: str = ""


def _view(data: bytes, code: Literal["B", "H", "I", "Q"]) -> memoryview[int]:
    size = array(code).itemsize
    if len(data) % size:
        raise ValueError(f"{len(data)} bytes are no whole number of {code!r} items")
    return memoryview(data).cast(code)


class _Networks:
    def __init__(self, family: Family, code: Literal["H", "I"]) -> None:
        self.wide = family.wide
        # Views of the decoded bytes, not copies: the tables are held once.
        self.first = _view(family.first, "Q" if family.wide else "I")
        self.first_lo = _view(family.first_lo if family.wide else b"", "Q")
        self.netlen, self.value = _view(family.netlen, "B"), _view(family.value, code)
        lined_up = len(self.first) == len(self.netlen) == len(self.value)
        if not lined_up or (self.wide and len(self.first_lo) != len(self.first)):
            raise ValueError("the tables do not line up")

    def _at(self, address: int) -> int:
        """The index of the last network starting at or below ``address`` (-1: none)."""
        if not self.wide:
            return bisect.bisect_right(self.first, address) - 1
        high, low = address >> 64, address & (HALF - 1)
        end = bisect.bisect_right(self.first, high)
        start = bisect.bisect_left(self.first, high, 0, end)
        at = bisect.bisect_right(self.first_lo, low, start, end) - 1
        return at if at >= start else start - 1

    def find(self, address: int) -> int | None:
        """The value of the network holding ``address``, or None."""
        at = self._at(address)
        if at < 0:
            return None
        first = (self.first[at] << 64) | self.first_lo[at] if self.wide else self.first[at]
        bits = 32 if address <= MAX_IPV4 else 128
        length = min(self.netlen[at], bits)
        if address > first + (1 << (bits - length)) - 1:
            return None
        return int(self.value[at])


class Lookup:
    """The networks of ``Tables``, asked by address (an int, as ``ipaddress`` gives it)."""

    def __init__(self, tables: Tables) -> None:
        self.source = tables.source
        self._countries = tables.countries
        self._asn_names = tables.asn_names
        self._main = (_Networks(tables.country_v4, "H"), _Networks(tables.country_v6, "H"))
        self._asn = (_Networks(tables.asn_v4, "I"), _Networks(tables.asn_v6, "I"))

    def find(self, address: int) -> Found:
        if not 0 <= address < 2**128:
            return Found()
        family = 0 if address < MAX_IPV4 else 1
        index = self._main[family].find(address)
        if index is None or index >= len(self._countries):
            return Found()
        code = self._countries[index].partition(":")[0]
        org_index = self._asn[family].find(address)
        org = ""
        if org_index is not None and org_index < len(self._asn_names):
            org = self._asn_names[org_index]
        return Found(country=code, private=index < PRIVATE_CODES, org=org)


ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(Tables)
