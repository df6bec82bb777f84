"""Where an egress address is: its country and autonomous system, looked up offline.

Why offline: the health service checks every proxy's egress on every round; asking a web service
would send each proxy's address to a third party and fail with it. The data comes from MaxMind
databases the operator passes with ``--geoip-db`` (GeoLite2-Country, -City and -ASN; each file
contributes what its records hold), or, without any, from the data bundled with geoip2fast.

Both answer ``Place()`` for what they cannot place: a string that is not an address, a private
address (``services.health.pure.echo.scope_of``, which counts the documentation ranges as public
so tests can map them), an address the data does not hold. A lookup never raises: a bad answer
from an echo URL must not end the checker.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import maxminddb

from services.health.geoip_tables import TablesError, load_tables
from services.health.pure import geotables
from services.health.pure.echo import SCOPE_PUBLIC, Address, parse_address, scope_of

FLAG = "--geoip-db"
BUNDLED_FILE = "geoip2fast-asn-ipv6.dat.gz"
"""Country and AS names, IPv4 and IPv6: the largest of geoip2fast's bundled files."""


class GeoIpError(Exception):
    """A geo database that cannot be used: the message names the flag, the path and the fix."""


@dataclass(frozen=True, slots=True)
class Place:
    country: str = ""
    """ISO 3166 alpha-2, upper case; "" unknown."""
    asn: int = 0
    """0 unknown."""
    org: str = ""
    """The AS organisation; "" unknown."""


class GeoLookup(Protocol):
    @property
    def db(self) -> str:
        """Which databases and their dates, for the record of each check."""
        ...

    def lookup(self, ip: str) -> Place:
        """Never raises for any string; unknown -> ``Place()``."""
        ...


def open_lookup(paths: Sequence[Path]) -> GeoLookup:
    """The MaxMind databases at ``paths`` (``--geoip-db``, repeatable), or geoip2fast's bundled
    data when there are none. Raises ``GeoIpError`` for a file that cannot be used, so a wrong
    path stops the service at its start rather than leaving every check unplaced."""
    if not paths:
        if _bundled_data_file() is None:
            raise GeoIpError(
                f"geoip2fast's bundled data ({BUNDLED_FILE}) is missing: reinstall "
                f"egress-proxies, or pass MaxMind databases with {FLAG}"
            )
        return bundled()
    return MaxMindLookup.open(paths)


class MaxMindLookup:
    """MaxMind DB files, asked in the order given; each field comes from the first that has it."""

    def __init__(self, readers: Sequence[maxminddb.Reader]) -> None:
        self._readers = tuple(readers)
        self.db = " + ".join(_describe(reader) for reader in self._readers)

    @classmethod
    def open(cls, paths: Sequence[Path]) -> MaxMindLookup:
        readers: list[maxminddb.Reader] = []
        try:
            for path in paths:
                readers.append(_open_reader(Path(path)))
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        return cls(readers)

    def lookup(self, ip: str) -> Place:
        address = _public_address(ip)
        if address is None:
            return Place()
        country, asn, org = "", 0, ""
        for reader in self._readers:
            try:
                record = reader.get(address)
            except (ValueError, maxminddb.InvalidDatabaseError, OSError):
                # An IPv6 address asked of an IPv4-only file, a damaged file, a closed reader.
                continue
            found = _place_of(record)
            country = country or found.country
            asn = asn or found.asn
            org = org or found.org
        return Place(country=country, asn=asn, org=org)

    def close(self) -> None:
        for reader in self._readers:
            reader.close()


class BundledLookup:
    """geoip2fast's bundled data (MaxMind GeoLite2, dated in ``db``): country and AS name, but NO
    AS number, so ``asn`` is always 0 here; checks that expect an ASN need a MaxMind ASN database
    (``--geoip-db GeoLite2-ASN.mmdb``).

    The data is loaded once per process, on the first lookup (or ``load()``, which a service can
    run in a thread before its first check), by a child process that hands over compact tables
    (``geoip_tables``): geoip2fast's own lists would cost this process about 108 MB.
    """

    def load(self) -> None:
        _bundled_engine()

    @property
    def db(self) -> str:
        return _bundled_engine().db

    def lookup(self, ip: str) -> Place:
        address = _public_address(ip)
        if address is None:
            return Place()
        engine = _bundled_engine()
        if engine.reader is None:
            return Place()
        found = engine.reader.find(int(address))
        if found.private:
            return Place()
        return Place(country=_iso_code(found.country), org=_text(found.org))


@dataclass(frozen=True, slots=True)
class _Engine:
    reader: geotables.Lookup | None
    """None when the data could not be loaded."""
    db: str


_bundled_lock = threading.Lock()
_bundled: list[_Engine] = []
"""The one loaded engine of the process (a list, so it is filled without ``global``)."""
_BUNDLED = BundledLookup()


def bundled() -> BundledLookup:
    """The process's geoip2fast lookup; it loads nothing until it is first asked."""
    return _BUNDLED


def _bundled_engine() -> _Engine:
    with _bundled_lock:
        if not _bundled:
            _bundled.append(_load_bundled())
        return _bundled[0]


def _load_bundled() -> _Engine:
    """A fresh load of the bundled data. A failure (a damaged installation) is kept as a ``db``
    that says so, because lookups must not raise: the checks then record no place."""
    data_file = _bundled_data_file()
    if data_file is None:
        return _Engine(
            None, f"geoip2fast (its {BUNDLED_FILE} is missing: reinstall egress-proxies)"
        )
    version = importlib.metadata.version("geoip2fast")
    try:
        reader = geotables.Lookup(load_tables(data_file))
    except (TablesError, ValueError) as err:
        return _Engine(None, f"geoip2fast {version} (failed to load {BUNDLED_FILE}: {err})")
    # "MAXMIND:GeoLite2-CountryASN-IPv4IPv6-en-20240618": the source's name says its date.
    source = reader.source
    return _Engine(reader, f"geoip2fast {version} ({source.partition(':')[2] or source})")


def _bundled_data_file() -> Path | None:
    """Found without importing geoip2fast (its import is the slow, environment-changing part).
    A full path, because given a bare name geoip2fast would look in the working directory first."""
    spec = importlib.util.find_spec("geoip2fast")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / BUNDLED_FILE).is_file():
            return Path(folder) / BUNDLED_FILE
    return None


def _open_reader(path: Path) -> maxminddb.Reader:
    try:
        with path.open("rb") as probe:
            probe.read(1)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise GeoIpError(
            f"{FLAG} {path}: cannot read it ({reason}); pass the path of a readable MaxMind "
            "database (.mmdb), or leave the flag out to use the bundled data"
        ) from err
    try:
        return maxminddb.open_database(path)
    except (maxminddb.InvalidDatabaseError, ValueError, OSError) as err:
        raise GeoIpError(
            f"{FLAG} {path} is not a MaxMind database (.mmdb): pass a GeoLite2-Country, "
            "-City or -ASN .mmdb file, or leave the flag out to use the bundled data"
        ) from err


def _describe(reader: maxminddb.Reader) -> str:
    meta = reader.metadata()
    built = datetime.fromtimestamp(meta.build_epoch, tz=UTC).date().isoformat()
    return f"{meta.database_type} {built}"


def _public_address(ip: str) -> Address | None:
    if not isinstance(ip, str):
        return None
    address = parse_address(ip.strip())
    if isinstance(address, str) or scope_of(address) != SCOPE_PUBLIC:
        return None
    return address


def _place_of(record: object) -> Place:
    """The GeoLite2 layouts: Country/City (``country``, else ``registered_country``) and ASN."""
    if not isinstance(record, dict):
        return Place()
    country = _iso_code(_field(record.get("country"), "iso_code")) or _iso_code(
        _field(record.get("registered_country"), "iso_code")
    )
    asn = record.get("autonomous_system_number")
    if not isinstance(asn, int) or isinstance(asn, bool) or not 0 < asn < 2**32:
        asn = 0
    return Place(
        country=country,
        asn=asn,
        org=_text(record.get("autonomous_system_organization")),
    )


def _field(value: object, key: str) -> object:
    return value.get(key) if isinstance(value, dict) else None


def _iso_code(value: object) -> str:
    if isinstance(value, str) and len(value) == 2 and value.isascii() and value.isalpha():
        return value.upper()
    return ""


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""
