"""geoip2fast's bundled data, loaded in a child process and handed over as compact tables
(services/health/pure/geotables.py says why).

    python -m services.health.geoip_tables DATA_FILE > tables.msgpack

The child loads geoip2fast as it is (its own loader, its own file), reads the networks from the
module's lists and writes the encoded ``Tables`` to its standard output; the service reads them
with ``load_tables``. The lists' 100 MB live and die with the child.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from services.health.pure.geotables import DECODER, ENCODER, Tables, build

TIMEOUT = 120.0
MAX_OUTPUT = 256 * 1024 * 1024
"""More than the tables of any geoip2fast file; a child that writes more is not ours."""


class TablesError(Exception):
    """The child could not load the data; the message says what it printed."""


def load_tables(data_file: Path) -> Tables:
    """The tables of ``data_file``, from a child process (blocking: run it in a thread)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "services.health.geoip_tables", str(data_file)],
            capture_output=True,
            timeout=TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TablesError(f"the loader did not run: {exc}") from exc
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise TablesError(said[-1] if said else f"the loader ended with {done.returncode}")
    if len(done.stdout) > MAX_OUTPUT:
        raise TablesError("the loader wrote more than any tables")
    try:
        return DECODER.decode(done.stdout)
    except Exception as exc:
        raise TablesError(f"the loader wrote no tables: {exc}") from exc


def tables_of(data_file: Path) -> Tables:
    """In the child: geoip2fast's lists for ``data_file`` as tables."""
    from geoip2fast import GeoIP2Fast  # noqa: PLC0415 - the child's whole purpose
    from geoip2fast import geoip2fast as module  # noqa: PLC0415

    reader = GeoIP2Fast(geoip2fast_data_file=str(data_file), verbose=False)
    source = str(reader.get_database_info().get("source_info", ""))
    lists: Any = module
    asn = bool(getattr(reader, "asn", False))
    return build(
        source=source,
        countries=lists.mainListNamesCountry,
        first=lists.mainListFirstIP,
        netlen=lists.mainListNetlength,
        country=lists.mainListIDCountryCodes,
        asn_names=lists.mainListNamesASN if asn else (),
        asn_first=lists.mainListFirstIPASN if asn else (),
        asn_netlen=lists.mainListNetlengthASN if asn else (),
        asn_id=lists.mainListIDASN if asn else (),
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m services.health.geoip_tables DATA_FILE", file=sys.stderr)
        return 2
    try:
        tables = tables_of(Path(args[0]))
    except Exception as exc:
        print(f"geoip2fast could not load {args[0]}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(ENCODER.encode(tables))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
