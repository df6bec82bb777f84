"""The compact geo tables (services/health/pure/geotables.py) on networks written here: the
last network at or below an address holds it only within its size, IPv4 and IPv6 apart, the
private indexes, and tables that do not line up refused when built or read."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.health.pure.geotables import DECODER, ENCODER, Family, Found, Lookup, Tables, build

COUNTRIES = [f"{n:02d}:Reserved" for n in range(16)] + ["DE:Germany", "US:United States"]
DE, US = 16, 17


def ip(text: str) -> int:
    return int(ipaddress.ip_address(text))


def tables() -> Tables:
    """10.0.0.0/8 private; 5.9.0.0/16 DE; 8.8.8.0/24 US; 2a01:4f8::/32 DE; AS names on two."""
    return build(
        source="TEST:tables-20261207",
        countries=COUNTRIES,
        first=[[ip("5.9.0.0"), ip("8.8.8.0")], [ip("10.0.0.0"), ip("2a01:4f8::")]],
        netlen=[[16, 24], [8, 32]],
        country=[[DE, US], [3, DE]],
        asn_names=["Hetzner Online GmbH", "GOOGLE"],
        asn_first=[[ip("5.9.0.0"), ip("8.8.8.0"), ip("2a01:4f8::")]],
        asn_netlen=[[16, 24, 32]],
        asn_id=[[0, 1, 0]],
    )


@pytest.mark.parametrize(
    ("address", "found"),
    [
        ("5.9.0.1", Found("DE", org="Hetzner Online GmbH")),
        ("5.9.255.255", Found("DE", org="Hetzner Online GmbH")),
        ("5.10.0.0", Found()),  # past the /16
        ("8.8.8.8", Found("US", org="GOOGLE")),
        ("8.8.9.0", Found()),
        ("10.1.2.3", Found("03", private=True)),
        ("1.1.1.1", Found()),  # below every network
        ("2a01:4f8::1", Found("DE", org="Hetzner Online GmbH")),
        ("2a01:4f9::", Found()),
        ("2001:db8::1", Found()),
    ],
)
def test_an_address_is_in_the_last_network_below_it_within_its_size(
    address: str, found: Found
) -> None:
    assert Lookup(tables()).find(ip(address)) == found


def test_tables_survive_their_encoding() -> None:
    made = tables()
    assert DECODER.decode(ENCODER.encode(made)) == made
    assert Lookup(DECODER.decode(ENCODER.encode(made))).find(ip("8.8.8.8")).country == "US"


@given(address=st.integers(min_value=-(2**130), max_value=2**130))
def test_no_int_makes_a_lookup_raise(address: int) -> None:
    found = Lookup(tables()).find(address)
    assert found.country in ("", "DE", "US", "03")


def test_empty_tables_place_nothing() -> None:
    empty = build(source="", countries=[], first=[], netlen=[], country=[])
    assert Lookup(empty).find(ip("8.8.8.8")) == Found()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"netlen": [[16]]}, "netlen: 1 values for 2 networks"),
        ({"country": [[DE, US, US]]}, "country: 3 values for 2 networks"),
        ({"first": [[ip("8.8.8.0"), ip("5.9.0.0")]]}, "first: the networks are not in order"),
        ({"first": [[-1, 5]]}, "outside"),
        ({"asn_id": [[0]]}, "asn_id: 1 values for 0 networks"),
    ],
)
def test_lists_that_do_not_line_up_are_refused(change: dict[str, object], says: str) -> None:
    given_lists: dict[str, object] = {
        "source": "",
        "countries": COUNTRIES,
        "first": [[ip("5.9.0.0"), ip("8.8.8.0")]],
        "netlen": [[16, 24]],
        "country": [[DE, US]],
    }
    with pytest.raises(ValueError, match=says):
        build(**(given_lists | change))  # type: ignore[arg-type]


def test_decoded_tables_that_do_not_line_up_are_refused() -> None:
    torn = Tables(
        source="",
        countries=COUNTRIES,
        country_v4=Family(wide=False, first=b"\x00" * 8, netlen=b"\x08", value=b"\x00\x00"),
        country_v6=Family(wide=True),
    )
    with pytest.raises(ValueError, match="do not line up"):
        Lookup(torn)
    odd = Tables(
        source="",
        countries=COUNTRIES,
        country_v4=Family(wide=False, first=b"\x00" * 5),
        country_v6=Family(wide=True),
    )
    with pytest.raises(ValueError, match="no whole number"):
        Lookup(odd)
