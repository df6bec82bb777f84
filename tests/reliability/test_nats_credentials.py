"""NATS credentials: private, kept across restarts, found by clients on this machine only, and
the same users in the bundled nats.conf.

``egress-proxies up`` writes one password per user under its data dir (0600) and announces where,
so a command in a second terminal needs no flags. Deployed services get theirs from the
environment; the repository's nats.conf reads them from there too.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import nats.errors
import pytest

from services.runtime.eventlog.streams import STREAMS, ensure_streams
from services.runtime.nats import server as natsserver
from services.runtime.nats.connection import Connection, connect, credentials_for
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.nats.users import USERS, password_variable
from services.runtime.ports import free_port
from services.runtime.settings.shared import Credentials
from tests.support.natsclient import client
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]


async def test_credentials_are_private_and_survive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "nats"
    first = EmbeddedNatsServer(data_dir=data, port=free_port())
    await first.start()
    files = [
        first.credentials_file,
        data / "nats-server.conf",
        first.context_file,
        first.reader_context_file,
    ]
    try:
        for path in files:
            assert path.stat().st_mode & 0o777 == 0o600, path
        before = first.credentials_file.read_text()
        kept = await connect(first.url, credentials=first.credentials_for("reconciler"))
        gen = kept.reconnects
    finally:
        await first.stop()
    again = EmbeddedNatsServer(data_dir=data, port=first.port)
    await again.start()
    try:
        assert again.credentials_file.read_text() == before
        # A client connected before the restart logs in again with what it had, and works.
        await until(lambda: _true(kept.reconnects > gen and kept.nc.is_connected), timeout=20)
        assert len(await ensure_streams(kept.js)) == len(STREAMS)
    finally:
        await kept.close()
        await again.stop()


async def _true(value: bool) -> bool:
    return value


async def test_a_user_added_since_gets_a_password_and_the_others_keep_theirs(
    tmp_path: Path,
) -> None:
    server = EmbeddedNatsServer(data_dir=tmp_path / "nats")
    old = {user: server.credentials_for(user).password for user in USERS}
    text = server.credentials_file.read_text().replace(f'"gc": "{old["gc"]}"', '"x": "y"')
    server.credentials_file.write_text(text)
    server.credentials_file.chmod(0o644)
    await server.start()
    try:
        new = {user: server.credentials_for(user).password for user in USERS}
        assert new["gc"] != old["gc"]
        assert {u: p for u, p in new.items() if u != "gc"} == {
            u: p for u, p in old.items() if u != "gc"
        }
        assert server.credentials_file.stat().st_mode & 0o777 == 0o600
    finally:
        await server.stop()


async def test_local_credentials_are_sent_to_this_machine_only(
    nats_server: EmbeddedNatsServer,
) -> None:
    port, admin = nats_server.port, nats_server.credentials_for("admin")
    assert credentials_for(nats_server.url) == admin
    assert credentials_for(f"nats://localhost:{port}", user="executor") == (
        nats_server.credentials_for("executor")
    )
    # A process the server has no user for (a command, a test-only service) is the admin.
    assert credentials_for(nats_server.url, user="appender") == admin
    for remote in (f"nats://10.0.0.7:{port}", f"nats://nats.example:{port}"):
        assert credentials_for(remote) is None
    assert credentials_for(nats_server.url_for("gc")) is None  # the URL's own user
    given = Credentials("reconciler", "from-the-environment")
    assert credentials_for(nats_server.url, given) is given


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "DATA_DIR"))}
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        env={**base, "PYTHONPATH": str(ROOT), **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_the_cli_finds_the_local_credentials_and_says_when_it_has_none(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    url = nats_server.url
    found = await asyncio.to_thread(cli, "streams", "info", "--nats-url", url, cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    # Without the announcement: from $DATA_DIR, as `up` wrote it.
    elsewhere = tmp_path / "empty-runtime"
    elsewhere.mkdir(mode=0o700)
    by_dir = await asyncio.to_thread(
        cli, "get", "--nats-url", url, cwd=tmp_path,
        XDG_RUNTIME_DIR=str(elsewhere), DATA_DIR=str(nats_server.data_dir.parent),
    )  # fmt: skip
    assert by_dir.returncode == 0, by_dir.stderr
    alone = await asyncio.to_thread(
        cli, "get", "--nats-url", url, cwd=tmp_path, XDG_RUNTIME_DIR=str(elsewhere)
    )
    assert alone.returncode == 3
    assert "refused the login (no credentials)" in alone.stderr
    login = nats_server.credentials_for("admin")
    explicit = await asyncio.to_thread(
        cli, "get", "--nats-url", url, cwd=tmp_path, XDG_RUNTIME_DIR=str(elsewhere),
        NATS_USER=login.user, NATS_PASSWORD=login.password,
    )  # fmt: skip
    assert explicit.returncode == 0, explicit.stderr
    wrong = await asyncio.to_thread(
        cli, "get", "--nats-url", url.replace("nats://", "nats://admin:nope@"), cwd=tmp_path
    )
    assert wrong.returncode == 3
    assert "refused the login (user 'admin')" in wrong.stderr
    assert "nope" not in wrong.stderr


PASSWORDS = {password_variable(u): f"pw-{u}" for u in USERS}
BINARY = Path(sys.executable).parent / "nats-server"


def bundled_conf(tmp_path: Path) -> tuple[Path, int]:
    """The repository's nats.conf on free loopback ports, with its store under ``tmp_path``."""
    port, monitor = free_port(), free_port()
    conf = (ROOT / "nats.conf").read_text()
    conf = conf.replace("0.0.0.0:4222", f"127.0.0.1:{port}")
    conf = conf.replace("0.0.0.0:8222", f"127.0.0.1:{monitor}")
    conf = conf.replace('"/data/jetstream"', f'"{tmp_path / "js"}"')
    (tmp_path / "nats.conf").write_text(conf)
    return tmp_path / "nats.conf", port


def test_the_bundled_nats_conf_needs_every_password(tmp_path: Path) -> None:
    conf, _ = bundled_conf(tmp_path)
    test = [str(BINARY), "-t", "-c", str(conf)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EGRESS_")}
    checked = subprocess.run(
        test, capture_output=True, text=True, check=False, env={**env, **PASSWORDS}
    )
    assert checked.returncode == 0, checked.stderr
    unset = subprocess.run(test, capture_output=True, text=True, check=False, env=env)
    assert unset.returncode != 0
    assert "EGRESS_ADMIN_PASSWORD" in unset.stdout + unset.stderr


async def test_the_bundled_nats_conf_enforces_the_same_users(tmp_path: Path) -> None:
    conf, port = bundled_conf(tmp_path)
    process = await asyncio.create_subprocess_exec(
        str(BINARY), "-c", str(conf), env={**os.environ, **PASSWORDS},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"nats://discovery:pw-discovery@127.0.0.1:{port}"

        async def listening() -> bool:
            try:
                async with client(url):
                    return True
            except (nats.errors.Error, OSError):
                return False

        await until(listening, timeout=20)
        async with client(url) as c:
            await c.nc.publish("proxy.p1.declared", b"{}")
            await c.nc.publish("lease.p1", b"{}")
            await c.nc.flush()
            await until(lambda: _true(c.refused("proxy.p1.declared")), timeout=10)
            assert not c.refused("lease.p1")
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            async with client(f"nats://127.0.0.1:{port}"):
                pass
    finally:
        process.terminate()
        await process.wait()


async def test_a_port_taken_before_the_bind_is_chosen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process may bind the port a server chose before the server does: the server
    chooses again instead of failing (seen in full test runs, where every test starts one)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    real = free_port
    picks = iter([taken])
    monkeypatch.setattr(natsserver, "free_port", lambda host: next(picks, 0) or real(host))
    server = EmbeddedNatsServer(data_dir=tmp_path / "nats")
    try:
        await server.start()
        assert server.port not in (0, taken)
        assert "address already in use" in server.log_file.read_text()
    finally:
        await server.stop()
        held.close()
    explicit = EmbeddedNatsServer(data_dir=tmp_path / "explicit", port=taken)
    with socket.socket() as again:
        again.bind(("127.0.0.1", taken))
        again.listen()
        with pytest.raises(natsserver.NatsServerError):  # a port asked for is not changed
            await explicit.start()
