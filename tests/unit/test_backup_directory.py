"""`backup DIR` writes only into a new or empty directory: whatever else is there is someone's,
and is refused before any server is asked, untouched."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from services.cli.backup.streamio import Target
from services.cli.main import main

# Nothing listens here: a refusal that reached for the server would say so instead.
NOWHERE = "nats://127.0.0.1:9"


def test_a_directory_with_files_in_it_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    theirs = tmp_path / "notes.txt"
    theirs.write_text("not a backup")
    result = CliRunner().invoke(main, ["backup", str(tmp_path), "--nats-url", NOWHERE])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path} is not empty" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert theirs.read_text() == "not a backup"


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    in_the_way = tmp_path / "backup"
    in_the_way.write_text("a file")
    result = CliRunner().invoke(main, ["backup", str(in_the_way), "--nats-url", NOWHERE])
    assert result.exit_code == 2, result.output
    assert in_the_way.read_text() == "a file"


def test_a_log_is_held_by_any_stream_but_a_first_orphan_sweep_alone() -> None:
    """A restore refuses a server that holds a log; the one sweep an `up` started once on a new
    data dir writes to GC is not one (the procedure in docs/operations.md runs that `up`)."""

    def target(**messages: int) -> Target:
        return Target(streams={n: {"state": {"messages": m}} for n, m in messages.items()})

    assert target(PROXY=0, LEASE=0, GC=1, DEADLETTER=0, POOL=0).holding() == {}
    assert target(PROXY=3, GC=1).holding() == {"PROXY": 3, "GC": 1}
    assert target(POOL=1).holding() == {"POOL": 1}
    assert target(DEADLETTER=2).holding() == {"DEADLETTER": 2}
    assert target(KV_x=5).holding() == {}
