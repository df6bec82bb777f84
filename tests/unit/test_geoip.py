"""Geo lookups of egress addresses from MaxMind files written here (tests/support/mmdb.py), read
through the reader the service uses (services/health/geoip.py). geoip2fast's bundled data is
loaded by a child process: tests/integration/test_geoip_bundled.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.health.geoip import GeoIpError, MaxMindLookup, Place, open_lookup
from tests.support.mmdb import write_asn_db, write_country_db, write_records

HOSTILE = ["", " ", "abc", "999.1.1.1", "1.2.3.4/24", "1.2.3.4:80", "fe80::1%eth0", "\x00", "::"]
HOSTILE += [
    "[2001:db8::1]",
    "1" * 5000,
    "\u0661\u0662\u0663.\u0661.\u0661.\u0661",
    "\u2028",
    "0x7f.1",
    "127.1",
]


# --- MaxMind files -----------------------------------------------------------------------------


@pytest.fixture
def country_and_asn(tmp_path: Path) -> Iterator[MaxMindLookup]:
    country = write_country_db(
        tmp_path / "GeoLite2-Country.mmdb",
        {"192.0.2.0/24": "DE", "198.51.100.0/24": "us", "2001:db8::/32": "FR"},
    )
    asn = write_asn_db(
        tmp_path / "GeoLite2-ASN.mmdb",
        {
            "192.0.2.0/25": (3320, "Deutsche Telekom AG"),
            "203.0.113.0/24": (64496, "Example Transit"),
            "2001:db8::/48": (3215, "Orange"),
        },
        built=datetime(2026, 11, 27, 23, 59, tzinfo=UTC),
    )
    lookup = open_lookup([country, asn])
    assert isinstance(lookup, MaxMindLookup)
    yield lookup
    lookup.close()


@pytest.mark.parametrize(
    ("ip", "place"),
    [
        ("192.0.2.7", Place(country="DE", asn=3320, org="Deutsche Telekom AG")),
        ("192.0.2.200", Place(country="DE")),
        ("::ffff:192.0.2.7", Place(country="DE", asn=3320, org="Deutsche Telekom AG")),
        ("198.51.100.1", Place(country="US")),
        ("203.0.113.9", Place(asn=64496, org="Example Transit")),
        ("2001:DB8::1", Place(country="FR", asn=3215, org="Orange")),
        ("2001:db8:1::1", Place(country="FR")),
        ("8.8.8.8", Place()),
        ("10.0.0.1", Place()),
        ("abc", Place()),
    ],
)
def test_each_file_contributes_what_it_holds(
    country_and_asn: MaxMindLookup, ip: str, place: Place
) -> None:
    assert country_and_asn.lookup(ip) == place


def test_db_names_each_file_and_its_build_date(country_and_asn: MaxMindLookup) -> None:
    assert country_and_asn.db == "GeoLite2-Country 2026-11-28 + GeoLite2-ASN 2026-11-27"


def test_a_registered_country_stands_in_for_a_missing_country(tmp_path: Path) -> None:
    """GeoLite2 leaves ``country`` out for some networks (anycast, satellite) but keeps where
    the network is registered."""
    path = write_records(
        tmp_path / "registered.mmdb",
        "GeoLite2-City",
        {"192.0.2.0/24": {"registered_country": {"iso_code": "NL"}}},
        datetime(2026, 1, 2, tzinfo=UTC),
    )
    lookup = MaxMindLookup.open([path])
    try:
        assert lookup.lookup("192.0.2.1") == Place(country="NL")
        assert lookup.db == "GeoLite2-City 2026-01-02"
    finally:
        lookup.close()


def test_an_ipv4_only_file_places_no_ipv6_address(tmp_path: Path) -> None:
    from mmdb_writer import MMDBWriter  # noqa: PLC0415
    from netaddr import IPSet  # noqa: PLC0415

    writer = MMDBWriter(ip_version=4, database_type="GeoLite2-Country")
    writer.insert_network(IPSet(["192.0.2.0/24"]), {"country": {"iso_code": "DE"}})
    writer.to_db_file(str(tmp_path / "v4.mmdb"))
    lookup = MaxMindLookup.open([tmp_path / "v4.mmdb"])
    try:
        assert lookup.lookup("192.0.2.1") == Place(country="DE")
        assert lookup.lookup("2001:db8::1") == Place()
    finally:
        lookup.close()


def test_a_missing_file_is_refused_with_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "GeoLite2-ASN.mmdb"
    with pytest.raises(GeoIpError) as caught:
        open_lookup([missing])
    assert str(caught.value).startswith(f"--geoip-db {missing}: cannot read it (No such file")
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_an_unreadable_path_is_refused_with_its_path(tmp_path: Path) -> None:
    """A directory: a file without read permission cannot be made where the tests run as root."""
    with pytest.raises(GeoIpError) as caught:
        open_lookup([tmp_path])
    assert str(caught.value).startswith(f"--geoip-db {tmp_path}: cannot read it (Is a directory")
    assert "readable MaxMind database" in str(caught.value)


@pytest.mark.parametrize("content", [b"GeoLite2, honest\n", b""])
def test_a_file_that_is_not_a_database_is_refused_with_its_path(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "GeoLite2-Country.csv"
    path.write_bytes(content)
    with pytest.raises(GeoIpError) as caught:
        open_lookup([path])
    assert str(caught.value).startswith(f"--geoip-db {path} is not a MaxMind database (.mmdb)")
    assert "leave the flag out" in str(caught.value)
    assert caught.value.__cause__ is not None


def test_a_bad_second_file_refuses_the_whole_set(tmp_path: Path) -> None:
    good = write_country_db(tmp_path / "c.mmdb", {"192.0.2.0/24": "DE"})
    with pytest.raises(GeoIpError, match=r"nothing\.mmdb"):
        open_lookup([good, tmp_path / "nothing.mmdb"])


@pytest.mark.parametrize("ip", HOSTILE)
def test_maxmind_hostile_strings_are_unknown(country_and_asn: MaxMindLookup, ip: str) -> None:
    assert country_and_asn.lookup(ip) == Place()


@pytest.fixture(scope="module")
def module_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MaxMindLookup]:
    """Module-scoped: hypothesis runs a test many times within one function-scoped fixture."""
    folder = tmp_path_factory.mktemp("mmdb")
    lookup = MaxMindLookup.open(
        [
            write_country_db(folder / "c.mmdb", {"192.0.2.0/24": "DE", "2001:db8::/32": "FR"}),
            write_asn_db(folder / "a.mmdb", {"192.0.2.0/24": (3320, "Deutsche Telekom AG")}),
        ]
    )
    yield lookup
    lookup.close()


@given(ip=st.one_of(st.text(), st.ip_addresses().map(str)))
def test_no_string_makes_a_lookup_raise(module_files: MaxMindLookup, ip: str) -> None:
    place = module_files.lookup(ip)
    assert place.country == "" or (len(place.country) == 2 and place.country.isupper())
    assert place.asn >= 0
