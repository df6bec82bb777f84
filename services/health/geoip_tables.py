"""geoip2fast's bundled data, loaded in a child process and handed over as compact tables
(services/health/pure/geotables.py says why).

    python -m services.health.geoip_tables DATA_FILE > tables.msgpack

The child loads geoip2fast as it is (its own loader, its own file), reads the networks from the
module's lists and writes the encoded ``Tables`` to its standard output; the service reads them
with ``load_tables``. The lists' 100 MB live and die with the child.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from subprocess import PIPE
from typing import IO, Any, cast

from services.health.pure.geotables import DECODER, ENCODER, Tables, build

TIMEOUT = 120.0
MAX_OUTPUT = 256 * 1024 * 1024
"""More than the tables of any geoip2fast file; a child that writes more is not ours."""
MAX_SAID = 64 * 1024
"""The tail of the child's complaint kept: its last line is what the error says."""
CHUNK = 1024 * 1024


class TablesError(Exception):
    """The child could not load the data; the message says what it printed."""


def load_tables(data_file: Path, *, command: Sequence[str] | None = None) -> Tables:
    """The tables of ``data_file``, from a child process (blocking: run it in a thread).

    What the child writes is read with bounds, not gathered whole and then checked: a child that
    writes without end (a damaged install, a hostile file) is stopped at ``MAX_OUTPUT`` bytes,
    its complaint is kept to its last ``MAX_SAID`` bytes, and a child that never ends is killed
    at ``TIMEOUT``. ``command`` replaces the child (tests feed it hostile ones)."""
    argv = list(command or [sys.executable, "-m", "services.health.geoip_tables"])
    argv.append(str(data_file))
    returncode, out, said = _run(argv)
    if returncode != 0:
        lines = said.decode("utf-8", "replace").strip().splitlines()
        raise TablesError(lines[-1] if lines else f"the loader ended with {returncode}")
    try:
        return DECODER.decode(out)
    except Exception as exc:
        raise TablesError(f"the loader wrote no tables: {exc}") from exc


def _run(argv: list[str]) -> tuple[int, bytes, bytes]:
    """The child's exit code, its output and the tail of its complaint, each bounded."""
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=PIPE, stderr=PIPE)
    except OSError as exc:
        raise TablesError(f"the loader did not run: {exc}") from exc
    with child, selectors.DefaultSelector() as selector:
        out, said = bytearray(), bytearray()
        selector.register(cast(IO[bytes], child.stdout), selectors.EVENT_READ, out)  # PIPE
        selector.register(cast(IO[bytes], child.stderr), selectors.EVENT_READ, said)
        deadline = time.monotonic() + TIMEOUT
        try:
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TablesError(f"the loader did not finish within {TIMEOUT:g} s")
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, CHUNK)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    kept: bytearray = key.data
                    kept += chunk
                    if kept is said:
                        del said[:-MAX_SAID]
                    elif len(out) > MAX_OUTPUT:
                        raise TablesError("the loader wrote more than any tables")
            return child.wait(max(deadline - time.monotonic(), 0.1)), bytes(out), bytes(said)
        except subprocess.TimeoutExpired:
            raise TablesError(f"the loader did not finish within {TIMEOUT:g} s") from None
        finally:
            if child.poll() is None:
                child.kill()


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
