"""geoip2fast's bundled data, loaded by a child process and read from compact tables
(services/health/geoip_tables.py, services/health/pure/geotables.py): the places the service
records, the tables agreeing with geoip2fast itself on any address, and a child that fails."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.health import geoip
from services.health.geoip import GeoIpError, Place, bundled, open_lookup
from services.health.geoip_tables import TablesError, load_tables, tables_of
from services.health.pure import geotables

pytestmark = pytest.mark.integration

HOSTILE = ["", " ", "abc", "999.1.1.1", "1.2.3.4/24", "1.2.3.4:80", "fe80::1%eth0", "\x00", "::"]
HOSTILE += ["[2001:db8::1]", "1" * 5000, "\u0661\u0662\u0663.\u0661.\u0661.\u0661", "0x7f.1"]


@pytest.mark.parametrize(
    ("ip", "place"),
    [
        ("5.9.0.1", Place(country="DE", org="Hetzner Online GmbH")),
        ("8.8.8.8", Place(country="US", org="GOOGLE")),
        ("2a01:4f8::1", Place(country="DE", org="Hetzner Online GmbH")),
        (" 8.8.8.8\n", Place(country="US", org="GOOGLE")),
        ("::ffff:8.8.8.8", Place(country="US", org="GOOGLE")),
        ("127.0.0.1", Place()),
        ("10.0.0.1", Place()),
        ("::1", Place()),
        ("192.0.2.1", Place()),
        ("abc", Place()),
    ],
)
def test_bundled_lookup(ip: str, place: Place) -> None:
    """No AS number: geoip2fast's data holds the AS name only."""
    assert open_lookup([]).lookup(ip) == place


def test_bundled_db_names_the_library_and_its_data() -> None:
    assert re.fullmatch(
        r"geoip2fast \d+\.\d+\.\d+ \(GeoLite2-CountryASN-IPv4IPv6-en-20\d{6}\)", open_lookup([]).db
    )


def test_the_bundled_data_is_shared_by_the_process() -> None:
    assert open_lookup([]) is open_lookup([]) is bundled()
    assert geoip._bundled_engine() is geoip._bundled_engine()


def test_loading_prints_nothing_and_keeps_the_environment(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The service logs to its standard streams, and its children inherit its environment;
    geoip2fast (which rewrites the environment when imported) runs in the loader's child."""
    before = dict(os.environ)
    engine = geoip._load_bundled()
    assert engine.reader is not None
    assert engine.reader.find(int(ipaddress.ip_address("8.8.8.8"))).country == "US"
    assert capfd.readouterr() == ("", "")
    assert dict(os.environ) == before


def test_missing_bundled_data_is_refused_at_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged installation: the service must say so when it starts, not record no place."""
    monkeypatch.setattr(geoip, "BUNDLED_FILE", "geoip2fast-absent.dat.gz")
    with pytest.raises(GeoIpError, match=r"reinstall egress-proxies, or pass .* --geoip-db"):
        open_lookup([])
    engine = geoip._load_bundled()
    assert engine.reader is None
    assert "geoip2fast-absent.dat.gz is missing" in engine.db


def test_a_file_the_child_cannot_load_is_an_error_saying_so(tmp_path: Path) -> None:
    broken = tmp_path / "geoip2fast-broken.dat.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(TablesError, match="geoip2fast could not load"):
        load_tables(broken)


@pytest.mark.parametrize("ip", HOSTILE)
def test_bundled_hostile_strings_are_unknown(ip: str) -> None:
    assert bundled().lookup(ip) == Place()


@pytest.fixture(scope="module")
def both() -> tuple[object, geotables.Lookup]:
    """geoip2fast itself and the tables made of its lists, in this process."""
    from geoip2fast import GeoIP2Fast  # noqa: PLC0415 - it rewrites the environment

    data = geoip._bundled_data_file()
    assert data is not None
    saved = dict(os.environ)
    try:
        tables = tables_of(data)
        reader = GeoIP2Fast(geoip2fast_data_file=str(data), verbose=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return reader, geotables.Lookup(tables)


ADDRESSES = st.one_of(
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
    st.integers(2**64, 2**128 - 1).map(ipaddress.IPv6Address),
    st.integers(0x2000 << 112, (0x2C00 << 112) - 1).map(ipaddress.IPv6Address),  # allocated
)


@settings(max_examples=3000)
@given(address=ADDRESSES)
def test_the_tables_place_any_address_as_geoip2fast_does(
    both: tuple[object, geotables.Lookup], address: ipaddress.IPv4Address | ipaddress.IPv6Address
) -> None:
    """The country of every address, and its AS where geoip2fast's AS network holds it (its
    own lookup also answers the AS of the network below an address no AS network holds). IPv6
    addresses from 2^64: below, between the IPv4 networks and the first IPv6 one, geoip2fast
    measures an IPv4 network with IPv6 sizes; no public address is there."""
    reader, lookup = both
    detail = reader.lookup(str(address))  # type: ignore[attr-defined]
    found = lookup.find(int(address))
    known = detail.country_code not in ("", "--") and not detail.is_private
    assert (found.country if not found.private else "") == (detail.country_code if known else "")
    if known:
        cidr = detail.asn_cidr
        held = False
        if cidr:
            network = ipaddress.ip_network(cidr, strict=False)
            first, last = int(network.network_address), int(network.broadcast_address)
            held = first <= int(address) <= last
        assert found.org == (detail.asn_name if held else "")


def test_the_tables_are_a_fraction_of_the_lists(both: tuple[object, geotables.Lookup]) -> None:
    """Not a speed target: the point of the tables, held as a fact (the lists cost 108 MB)."""
    data = geoip._bundled_data_file()
    assert data is not None
    encoded = geotables.ENCODER.encode(tables_of(data))
    assert len(encoded) < 20 * 1024 * 1024
