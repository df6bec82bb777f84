"""Backup and restore, end to end (docs/operations.md, "Backup and restore").

The whole system under a lease load (real `up`, Squids enforcing leases, the discovery API):
`egress-proxies backup` while crawlers lease, report and release, more activity after it, then
the disaster: `up` stops and its nats-server's store is lost. `egress-proxies restore` fills a
fresh nats-server (the same users, an empty store), and `up` starts on it with its data dir,
where the local proxies are still running. Then the views at the backup's instant are those of
the original, every write acknowledged before the backup began is there and none made after it,
the running proxies are adopted, and a new lease's fencing token is above every token the lost
system granted, so the proxies that remember those tokens serve it. The same backup restored on
a fresh data dir (another machine) replaces the proxies instead, and they serve new leases too.

What a restore refuses is tests/e2e/test_backup_refusals.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.cli.log.timetravel import as_of
from services.runtime.eventlog.asof import parse_instant, read_until
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import CONFIG_FILE, find_binary
from services.runtime.ports import free_port
from tests.support.system import (
    ROOT,
    Up,
    base_env,
    cli,
    fetch_via,
    hello_target,
    stop_local_proxies,
    supervised,
)
from tests.support.waiting import until

pytestmark = pytest.mark.e2e

HELLO = "hello through the proxy"
PROXIES = "\n---\n".join(
    "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
    f"metadata: {{name: px-{i}, namespace: backup}}\n"
    f"spec: {{provider: local, attributes: {{slot: '{i}'}}}}\n"
    for i in range(4)
)


@asynccontextmanager
async def up_on(data_dir: Path, nats_port: int, target: str) -> AsyncIterator[Up]:
    """`up` on ``data_dir``, stopped with SIGINT; unlike ``running_up`` it leaves the local
    proxies running, as a real stop does, so the next `up` on the data dir can adopt them."""
    api_port, env = free_port(), base_env()
    args = ["--data-dir", str(data_dir), "--nats-port", str(nats_port), "--api-port", str(api_port)]
    args += ["--metrics-port", "0", "--health-check-url", target, "--lease-cooldown", "0s"]
    args += ["--observe-interval", "1", "--gateway-port", str(free_port())]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli.main", "up", *args,
        env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    url = f"nats://127.0.0.1:{nats_port}"
    up = Up(
        process, {**env, "NATS_URL": url}, f"http://127.0.0.1:{api_port}", data_dir, bytearray()
    )
    async with supervised(up):
        yield up


@dataclass
class Load:
    """Crawlers leasing, using, reporting on and releasing proxies; what the API acknowledged,
    with the moment the answer came."""

    api: str
    target: str
    phase: str = "before"
    acked: list[tuple[float, str, str, str]] = field(default_factory=list)
    """(when, what, lease id, detail): acquired (detail: the token), reported, released."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def crawler(self, number: int) -> None:
        async with httpx.AsyncClient(base_url=self.api, timeout=30) as client:
            turn = 0
            while not self.stop.is_set():
                got = await client.post(
                    "/v1/leases",
                    json={"ttlSeconds": 20, "holder": f"load-{number}", "waitSeconds": 5},
                )
                if got.status_code == 503:
                    continue
                assert got.status_code == 201, got.text
                lease, turn = got.json(), turn + 1
                self.note("acquired", lease["id"], str(lease["fencingToken"]))
                assert (
                    await asyncio.to_thread(fetch_via, lease["proxy"]["url"], self.target) == HELLO
                )
                outcome, host = (
                    ("blocked", f"{self.phase}.example") if turn % 2 else ("success", "ok.example")
                )
                report = {"outcome": outcome, "target": host}
                done = await client.post(f"/v1/leases/{lease['id']}/report", json=report)
                assert done.status_code == 204, done.text
                self.note("reported", lease["id"], f"{outcome} {host}")
                done = await client.delete(f"/v1/leases/{lease['id']}")
                assert done.status_code == 204, done.text
                self.note("released", lease["id"], "")

    def note(self, what: str, lease_id: str, detail: str) -> None:
        self.acked.append((time.monotonic(), what, lease_id, detail))

    def before(self, instant: float) -> set[tuple[str, str, str]]:
        return {(w, i, d) for at, w, i, d in self.acked if at < instant}

    def after(self, instant: float) -> set[tuple[str, str, str]]:
        return {(w, i, d) for at, w, i, d in self.acked if at > instant}

    def tokens(self) -> list[int]:
        return [int(d) for _, w, _, d in self.acked if w == "acquired"]


async def lease_facts(conn: Connection) -> set[tuple[str, str, str]]:
    """The LEASE stream's acquisitions, reports and releases, as the load notes them."""
    facts: set[tuple[str, str, str]] = set()
    for stored in (await read_until(conn.js, "LEASE", "lease.*", None, limit=10**6)).items:
        event = stored.recorded.event
        kind = type(event).__name__
        if kind == "LeaseAcquired":
            facts.add(("acquired", event.lease_id, str(stored.recorded.seq)))  # type: ignore[union-attr]
        elif kind == "LeaseReported":
            facts.add(("reported", event.lease_id, f"{event.outcome} {event.target}"))  # type: ignore[union-attr]
        elif kind == "LeaseReleased":
            facts.add(("released", event.lease_id, ""))  # type: ignore[union-attr]
    return facts


async def views_at(conn: Connection, at: str) -> tuple[Any, Any]:
    proxies, leases = await as_of(conn, None, parse_instant(at))
    return list(proxies), dict(sorted(leases.items()))


def admin_url(data_dir: Path, port: int) -> str:
    users = json.loads((data_dir / "nats" / "credentials.json").read_text())["users"]
    return f"nats://admin:{users['admin']}@127.0.0.1:{port}"


async def restore_alone(
    data: Path, port: int, backup: Path, *, check: dict[str, Any] | None = None
) -> None:
    """`up`'s nats-server alone on its data dir (its port, users and store), the backup
    restored into it as the admin, the server stopped: the services start on the restored log."""
    server = await asyncio.create_subprocess_exec(
        str(find_binary()), "-c", str(data / "nats" / CONFIG_FILE),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = admin_url(data, port)
        await until(lambda: _answers(url), timeout=20, what="the nats-server alone")
        env = {**base_env(), "NATS_URL": url}
        restored = await asyncio.to_thread(cli, "restore", str(backup), env=env)
        assert restored.returncode == 0, restored.stdout + restored.stderr
        if check is not None:
            conn = await connect(url)
            try:
                await _check_the_cut(conn, check)
            finally:
                await conn.close()
    finally:
        server.terminate()
        async with asyncio.timeout(30):
            await server.wait()


async def test_a_backup_under_load_restores_the_system_as_it_was(tmp_path: Path) -> None:
    data, port, backup = tmp_path / "data", free_port(), tmp_path / "backup"
    manifest_file = tmp_path / "proxies.yaml"
    manifest_file.write_text(PROXIES.rsplit("\n---\n", 1)[0])
    extra = tmp_path / "extra.yaml"
    extra.write_text(PROXIES.rsplit("\n---\n", 1)[1])
    with hello_target() as target:
        try:
            async with up_on(data, port, target) as original:
                applied = await original.cli(
                    "apply", "-f", str(manifest_file), "--wait", timeout=240
                )
                assert applied.returncode == 0, applied.stdout + applied.stderr
                load = Load(original.api, target)
                crawlers = [asyncio.create_task(load.crawler(n)) for n in range(2)]
                await until(lambda: len(load.tokens()) >= 10, timeout=60, what="leases granted")
                began = time.monotonic()
                taken = await original.cli("backup", str(backup))
                ended = time.monotonic()
                assert taken.returncode == 0, taken.stdout + taken.stderr
                load.phase = "after"
                await until(lambda: len(load.after(ended)) >= 12, timeout=60, what="leases after")
                load.stop.set()
                await asyncio.gather(*crawlers)
                manifest = json.loads((backup / "manifest.json").read_text())
                cut = manifest["cut"][:26] + "Z"
                seen = await original.cli("get", "--at", cut, "-o", "json")
                assert seen.returncode == 0, seen.stderr
                conn = await connect(admin_url(data, port))
                try:
                    views, lost = await views_at(conn, cut), await lease_facts(conn)
                finally:
                    await conn.close()
                proxies = {p["uid"]: p for p in await original.proxies()}
                pids = {uid: original.squid_pid(p["providerID"]) for uid, p in proxies.items()}
                highest = max(load.tokens())

            # The disaster: the store is gone; a fresh server with the same users gets the backup.
            shutil.rmtree(data / "nats" / "jetstream")
            await restore_alone(data, port, backup, check=manifest)

            async with up_on(data, port, target) as again:
                await until(
                    lambda: _all_in_service(again, set(proxies)), timeout=120, what="proxies"
                )
                # The views at the backup's instant are the original's.
                replayed = await again.cli("get", "--at", cut, "-o", "json")
                assert json.loads(replayed.stdout) == json.loads(seen.stdout)
                conn = await connect(admin_url(data, port))
                try:
                    assert await views_at(conn, cut) == views
                    facts = await lease_facts(conn)
                finally:
                    await conn.close()
                # Nothing acknowledged before the backup began is lost; what came after it is.
                acknowledged = {
                    (w, i, "" if w == "acquired" else d) for w, i, d in load.before(began)
                }
                assert acknowledged <= {(w, i, "" if w == "acquired" else d) for w, i, d in facts}
                assert acknowledged
                later = {(w, i) for w, i, _ in load.after(ended)}
                assert later
                assert not later & {(w, i) for w, i, _ in facts}
                assert all(f in lost for f in facts if f[0] == "acquired")
                # The outcomes are the original's at the cut: report counts and back-offs (for
                # reports before it; none for those after it).
                targets = set()
                for uid in proxies:
                    status, one = await again.api_call("GET", f"/v1/proxies/{uid}")
                    assert status == 200, one
                    reports = views[1][uid].reports
                    assert one["reports"] == {
                        "success": reports.success,
                        "blocked": reports.blocked,
                        "failed": reports.failed,
                        "failedStreak": reports.failed_streak,
                    }
                    running = {(b["target"], b["blocks"]) for b in one["backoffs"]}
                    assert running == {(t, b.blocks) for t, b in reports.backoffs.items()}
                    targets |= {target for target, _ in running}
                assert targets == {"before.example"}
                # The running proxies were adopted: the same instances, the same processes.
                now = {p["uid"]: p for p in await again.proxies()}
                assert {u: p["providerID"] for u, p in now.items()} == {
                    u: p["providerID"] for u, p in proxies.items()
                }
                assert {u: again.squid_pid(now[u]["providerID"]) for u in now} == pids
                # Fencing tokens go on rising past every token granted, after the backup too,
                # and the adopted proxies, which remember those, serve the new leases.
                async with httpx.AsyncClient(base_url=again.api, timeout=60) as client:
                    for uid in proxies:
                        got = await client.post(
                            "/v1/leases",
                            json={"proxyUid": uid, "ttlSeconds": 30, "waitSeconds": 40},
                        )
                        assert got.status_code == 201, got.text
                        lease = got.json()
                        assert lease["fencingToken"] > highest
                        fetched = await asyncio.to_thread(fetch_via, lease["proxy"]["url"], target)
                        assert fetched == HELLO
                # The services carry on from the restored log: a new proxy comes up.
                applied = await again.cli("apply", "-f", str(extra), "--wait", timeout=240)
                assert applied.returncode == 0, applied.stdout + applied.stderr
            await _elsewhere(tmp_path / "elsewhere", backup, target, pids, highest)
        finally:
            stop_local_proxies(data)
            stop_local_proxies(tmp_path / "elsewhere")


async def _elsewhere(
    data: Path, backup: Path, target: str, pids: dict[str, int], highest: int
) -> None:
    """The same backup on another machine, as docs/operations.md tells: `up` once on a new data
    dir (its server's users and configuration; it creates empty streams), that server alone for
    the restore, then `up`. A fresh data dir has a fresh lease secret and no local proxy to
    adopt: the instances the log names are gone and are replaced; the new ones serve new leases,
    whose tokens are above every token granted before."""
    port = free_port()
    async with up_on(data, port, target):
        pass
    await restore_alone(data, port, backup)
    async with up_on(data, port, target) as elsewhere:
        await until(lambda: _all_in_service(elsewhere, set(pids)), timeout=180, what="replaced")
        found = {p["uid"]: p for p in await elsewhere.proxies()}
        replaced = {u: elsewhere.squid_pid(found[u]["providerID"]) for u in pids}
        assert not set(replaced.values()) & set(pids.values())
        async with httpx.AsyncClient(base_url=elsewhere.api, timeout=60) as client:
            for uid in pids:
                got = await client.post(
                    "/v1/leases", json={"proxyUid": uid, "ttlSeconds": 30, "waitSeconds": 40}
                )
                assert got.status_code == 201, got.text
                assert got.json()["fencingToken"] > highest
                fetched = await asyncio.to_thread(fetch_via, got.json()["proxy"]["url"], target)
                assert fetched == HELLO


async def _answers(url: str) -> bool:
    with contextlib.suppress(Exception):
        conn = await connect(url)
        await conn.close()
        return True
    return False


async def _all_in_service(up: Up, uids: set[str]) -> bool:
    found = {p["uid"]: p for p in await up.proxies()}
    return uids <= set(found) and all(
        found[u]["phase"] == "Ready" and found[u]["healthy"] is True for u in uids
    )


async def _check_the_cut(conn: Connection, manifest: dict[str, Any]) -> None:
    """Right after the restore: each stream holds what the backup held, nothing stamped after
    the cut, and LEASE continues past a million sequences beyond what the backup saw."""
    cut = parse_instant(manifest["cut"][:26] + "Z")
    for entry in manifest["streams"]:
        info = await conn.js.stream_info(entry["name"])
        assert info.state.messages == entry["messages"], entry["name"]
        if entry["messages"]:
            last = await conn.js.get_msg(entry["name"], entry["last_seq"])
            assert last.seq == entry["last_seq"]
            assert last.time is not None
            assert last.time <= cut
        if entry["name"] == "LEASE":
            assert info.state.last_seq == entry["observed_last_seq"] + 1_000_000
        else:
            assert info.state.last_seq == entry["last_seq"]
    durables = {c["name"] for e in manifest["streams"] for c in e["consumers"]}
    assert durables == {"reconciler", "executor"}
    for entry in manifest["streams"]:
        for consumer in entry["consumers"]:
            found = await conn.js.consumer_info(entry["name"], consumer["name"])
            assert found.ack_floor is not None
            assert found.ack_floor.stream_seq == consumer["ack_floor_stream_seq"]
