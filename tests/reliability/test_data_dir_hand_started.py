"""A nats-server started by hand on a data dir's store, whatever its command line, keeps the
next `up` off that store (docs/decisions/0136-a-store-is-found-by-what-runs-on-it.md).

Two servers on one store fork its streams for good. A server `up` left behind is stopped by the
next `up` (test_data_dir_leftovers.py); one started by hand, here with a relative ``-c`` from
the directory above the data dir, is the operator's: `up` exits 2 naming its pid, starts no
server, and the hand-started one serves on, alone on the store, with what it stored.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest

from services.runtime.nats.server import CONFIG_FILE, PID_FILE, EmbeddedNatsServer, find_binary
from tests.reliability.test_data_dir_lock import second_up
from tests.support.system import processes_mentioning
from tests.support.waiting import until

pytestmark = pytest.mark.reliability


async def stored(server: EmbeddedNatsServer, *, add: bool = False) -> int:
    """Messages in a stream the hand-started server holds; ``add`` makes it with one first."""
    creds = server.credentials_for("admin")
    nc = await nats.connect(server.url, user=creds.user, password=creds.password)
    try:
        js = nc.jetstream()
        if add:
            await js.add_stream(name="HAND", subjects=["hand.>"])
            await js.publish("hand.one", b"kept")
        return (await js.stream_info("HAND")).state.messages
    finally:
        await nc.close()


async def test_up_refuses_a_store_a_hand_started_server_uses_via_a_relative_config(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    server = EmbeddedNatsServer(data_dir=data_dir / "nats")
    server.write_config()
    relative = f"data/nats/{CONFIG_FILE}"
    # Started as an operator would, from the directory above the data dir: the absolute path of
    # the configuration is nowhere on its command line.
    with (tmp_path / "hand.log").open("ab") as out:
        hand = await asyncio.create_subprocess_exec(
            str(find_binary()), "-c", relative, cwd=tmp_path,
            stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    try:
        await until((data_dir / "nats" / PID_FILE).is_file, timeout=30, what="its pid file")
        assert processes_mentioning(str(server.config_file)) == []
        assert await stored(server, add=True) == 1
        code, said = await second_up(data_dir)
        assert code == 2, said
        assert f"pid {hand.pid}" in said, said
        assert "--data-dir" in said, said
        assert "Traceback" not in said, said
        # Nothing was started or stopped: the hand-started server serves alone, with its data.
        assert hand.returncode is None
        assert processes_mentioning(f"-c {relative}") == [hand.pid]
        assert processes_mentioning(str(server.config_file)) == []
        assert int((data_dir / "nats" / PID_FILE).read_text()) == hand.pid
        assert await stored(server) == 1
        assert json.loads(server.credentials_file.read_text())
    finally:
        if hand.returncode is None:
            hand.terminate()
        await hand.wait()
