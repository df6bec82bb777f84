"""Small MaxMind databases in GeoLite2's layouts, written for a test.

Why real files: the lookup is tested through the same reader the service opens the operator's
databases with, so a layout this module got wrong would fail there as it would in production.
The tests map documentation addresses (192.0.2.0/24, 2001:db8::/32), which real data leaves out.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mmdb_writer import MMDBWriter
from netaddr import IPSet

BUILT = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
"""The build date the files carry unless a test gives one: the lookup's ``db`` names it."""


class _DatedWriter(MMDBWriter):
    """mmdb-writer stamps the time of writing; a test needs a date it can expect."""

    def __init__(self, built: datetime, **options: Any) -> None:
        super().__init__(**options)
        self._built = built

    def _build_meta(self) -> dict[str, Any]:
        return {**super()._build_meta(), "build_epoch": int(self._built.timestamp())}


def write_country_db(path: Path, countries: Mapping[str, str], *, built: datetime = BUILT) -> Path:
    """A GeoLite2-Country file: each CIDR (IPv4 or IPv6) to its ISO country code."""
    return write_records(
        path,
        "GeoLite2-Country",
        {cidr: {"country": {"iso_code": code}} for cidr, code in countries.items()},
        built,
    )


def write_asn_db(
    path: Path, systems: Mapping[str, tuple[int, str]], *, built: datetime = BUILT
) -> Path:
    """A GeoLite2-ASN file: each CIDR to its AS number and organisation."""
    return write_records(
        path,
        "GeoLite2-ASN",
        {
            cidr: {"autonomous_system_number": asn, "autonomous_system_organization": org}
            for cidr, (asn, org) in systems.items()
        },
        built,
    )


def write_records(
    path: Path,
    database_type: str,
    records: Mapping[str, dict[str, Any]],
    built: datetime = BUILT,
) -> Path:
    """Any layout: each CIDR to its record, as the reader will return it."""
    # An IPv6 tree with IPv4 in ::/96, as GeoLite2 ships, so both families can be mapped.
    writer = _DatedWriter(
        built,
        ip_version=6,
        ipv4_compatible=True,
        database_type=database_type,
        languages=["en"],
        description=f"{database_type} for tests",
    )
    for cidr, record in records.items():
        writer.insert_network(IPSet([cidr]), record)
    writer.to_db_file(str(path))
    return path
