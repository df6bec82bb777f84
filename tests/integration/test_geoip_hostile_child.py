"""The geo tables' loader against children that misbehave (services/health/geoip_tables.py):
whatever the child writes, however long it runs, the service gets tables or a ``TablesError``
that says why, within the loader's bounds; never a crash, a hang or unbounded memory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.health import geoip_tables
from services.health.geoip_tables import TablesError, load_tables
from services.health.pure.geotables import ENCODER, build

pytestmark = pytest.mark.integration


def child(code: str) -> list[str]:
    """A child running ``code``; the loader appends the data file as its argument."""
    return [sys.executable, "-c", code]


def small_tables() -> bytes:
    return ENCODER.encode(
        build(
            source="test",
            countries=["", "DE"],
            first=[[0, 16]],
            netlen=[[28, 28]],
            country=[[0, 1]],
        )
    )


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "geo.dat.gz"
    path.write_bytes(b"")
    return path


def test_a_well_behaved_child_gives_its_tables(data: Path, tmp_path: Path) -> None:
    """The control: the same way of running a child, with tables at the end of it, works."""
    good = tmp_path / "good.bin"
    good.write_bytes(small_tables())
    code = f"import sys; sys.stdout.buffer.write(open({str(good)!r}, 'rb').read())"
    tables = load_tables(data, command=child(code))
    assert tables.source == "test"


def test_endless_output_is_cut_at_the_bound(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(geoip_tables, "MAX_OUTPUT", 4 * 1024 * 1024)
    code = "import sys\nb = b'x' * 65536\nwhile True: sys.stdout.buffer.write(b)"
    with pytest.raises(TablesError, match="wrote more than any tables"):
        load_tables(data, command=child(code))


def test_an_endless_complaint_keeps_its_last_words(data: Path) -> None:
    """Fifty megabytes on stderr, then the line that says what went wrong."""
    code = (
        "import sys\nfor _ in range(800): sys.stderr.write('noise ' * 10000 + '\\n')\n"
        "sys.stderr.write('the last words\\n'); sys.exit(3)"
    )
    with pytest.raises(TablesError, match=r"^the last words$"):
        load_tables(data, command=child(code))


def test_a_child_that_never_ends_is_killed(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(geoip_tables, "TIMEOUT", 1.0)
    with pytest.raises(TablesError, match="did not finish within 1 s"):
        load_tables(data, command=child("import time; time.sleep(60)"))


def test_a_child_that_closes_its_output_and_lingers_is_killed(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(geoip_tables, "TIMEOUT", 1.0)
    code = "import os, sys, time; os.close(1); os.close(2); time.sleep(60)"
    with pytest.raises(TablesError, match="did not finish within 1 s"):
        load_tables(data, command=child(code))


@pytest.mark.parametrize(
    "written",
    [
        b"",
        b"\xff\xfe garbage \x00",
        ENCODER.encode({"source": "x"}),
        ENCODER.encode([1, 2, 3]),
        small_tables()[:-7],
        small_tables() + b"\x00",
    ],
    ids=["nothing", "garbage", "a map of the wrong shape", "an array", "torn", "trailing bytes"],
)
def test_output_that_is_no_tables_is_refused(data: Path, tmp_path: Path, written: bytes) -> None:
    out = tmp_path / "out.bin"
    out.write_bytes(written)
    code = f"import sys; sys.stdout.buffer.write(open({str(out)!r}, 'rb').read())"
    with pytest.raises(TablesError, match="the loader wrote no tables"):
        load_tables(data, command=child(code))


def test_a_complaint_that_is_no_text_is_still_said(data: Path) -> None:
    code = "import sys; sys.stderr.buffer.write(b'bad \\xff\\xfe bytes\\n'); sys.exit(1)"
    with pytest.raises(TablesError, match="bad \ufffd\ufffd bytes"):
        load_tables(data, command=child(code))


def test_a_child_killed_by_a_signal_says_how_it_ended(data: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    with pytest.raises(TablesError, match="the loader ended with -9"):
        load_tables(data, command=child(code))


def test_a_child_that_cannot_start_is_an_error(data: Path, tmp_path: Path) -> None:
    with pytest.raises(TablesError, match="the loader did not run"):
        load_tables(data, command=[str(tmp_path / "no-such-program")])
