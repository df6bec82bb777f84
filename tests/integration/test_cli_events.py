"""``events`` against a real nats-server: the table and JSON of one proxy or all, the other
streams, poison messages, and ``--follow`` tailing until Ctrl-C, across a server restart.

Commands run in-process through click's runner (tests/support/clirun.py); ``--follow`` runs as a
real process, stopped with SIGINT.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from pathlib import Path

import pytest

from events import subjects
from events.schemas import (
    DeadLettered,
    HealthChanged,
    LeaseAcquired,
    LeaseReleased,
    OrphanFound,
    SweepCompleted,
)
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import ensure_streams
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.ports import free_port
from tests.support.cli_process import ROOT, clean_env, read_line
from tests.support.cli_seed import json_lines, seed_proxy, seed_with_poison
from tests.support.clirun import cli, restore_logging_after

pytestmark = pytest.mark.integration

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


async def test_events_table_shows_one_proxy_in_order_with_poison_messages(
    conn: Connection, jetstream_store: JetStreamEventStore, nats_server: EmbeddedNatsServer
) -> None:
    await seed_with_poison(conn, jetstream_store)
    result = await cli("events", "--proxy", "p1", "--nats-url", nats_server.url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["SEQ", "TIME", "SUBJECT", "TYPE", "SUMMARY"]
    rows = [line.split() for line in lines[1:] if line.strip()]
    assert [row[0] for row in rows] == ["1", "2", "3", "4", "5", "6"]
    assert [row[3] for row in rows] == [
        "ProxyDeclared",
        "CreateInstance",
        "InstanceObserved",
        "PhaseChanged",
        "?",
        "?",
    ]
    assert all(ISO_UTC.match(row[1]) for row in rows)
    assert all(row[2].startswith("proxy.p1.") for row in rows)
    assert "name=n-p1" in lines[1]
    assert "state=Running ip=10.1.2.3" in lines[3]
    assert "unknown event type 'Teleported'" in lines[5]
    assert "HealthChanged" in lines[6]
    assert "p2" not in result.stdout


async def test_events_json_is_one_object_per_line(
    conn: Connection, jetstream_store: JetStreamEventStore, nats_server: EmbeddedNatsServer
) -> None:
    await seed_with_poison(conn, jetstream_store)
    result = await cli("events", "-o", "json", "--nats-url", nats_server.url)
    assert result.exit_code == 0, result.output
    records = json_lines(result.stdout)
    assert [r["seq"] for r in records] == list(range(1, 11))
    assert {r["subject"].split(".")[1] for r in records} == {"p1", "p2"}
    first = records[0]
    assert set(first) == {"seq", "time", "subject", "type", "event"}
    assert ISO_UTC.match(first["time"])
    assert first["type"] == "ProxyDeclared"
    assert first["event"]["namespace"] == "crawl"
    assert first["event"]["spec"]["provider"] == "local"
    unknown, broken = records[4], records[5]
    assert unknown["type"] == "?"
    assert unknown["event"] is None
    assert unknown["error"] == "unknown event type 'Teleported'"
    assert broken["type"] == "?"
    assert "HealthChanged" in broken["error"]
    assert json.loads(broken["payload"]) == {"type": "HealthChanged", "healthy": 3}


async def test_events_of_one_proxy_in_the_lease_and_gc_streams(
    conn: Connection, jetstream_store: JetStreamEventStore, nats_server: EmbeddedNatsServer
) -> None:
    for uid in ("p1", "p2"):
        await jetstream_store.append(
            subjects.lease(uid),
            [
                NewEvent(
                    LeaseAcquired(lease_id=f"l-{uid}", proxy_uid=uid, ttl_seconds=30), f"a-{uid}"
                ),
                NewEvent(LeaseReleased(lease_id=f"l-{uid}", proxy_uid=uid), f"r-{uid}"),
            ],
        )
    await jetstream_store.append(
        subjects.gc("local"),
        [
            NewEvent(OrphanFound(provider="local", provider_id="i-9", owner_uid="p1"), "o1"),
            NewEvent(OrphanFound(provider="local", provider_id="i-8", owner_uid="p2"), "o2"),
            NewEvent(SweepCompleted(provider="local", listed=5, orphans=2, deleted=0), "s"),
        ],
    )
    lease = await cli(
        "events", "--stream", "lease", "--proxy", "p1", "-o", "json", "--nats-url", nats_server.url
    )
    assert lease.exit_code == 0, lease.output
    assert [(r["type"], r["subject"]) for r in json_lines(lease.stdout)] == [
        ("LeaseAcquired", "lease.p1"),
        ("LeaseReleased", "lease.p1"),
    ]
    gc = await cli(
        "events", "--stream", "GC", "--proxy", "p1", "-o", "json", "--nats-url", nats_server.url
    )
    assert gc.exit_code == 0, gc.output
    assert [r["event"]["provider_id"] for r in json_lines(gc.stdout)] == ["i-9"]
    whole = await cli("events", "--stream", "GC", "--nats-url", nats_server.url)
    assert "SweepCompleted" in whole.stdout
    assert "listed=5 orphans=2 deleted=0" in whole.stdout

    for n, subject in enumerate(("proxy.p1.cmd", "proxy.p2.cmd", "lease.p1")):
        dead = DeadLettered(
            consumer="executor",
            stream="PROXY",
            subject=subject,
            sequence=n + 1,
            deliveries=5,
            reason="boom",
            payload="{}",
        )
        await jetstream_store.append(subjects.deadletter("executor"), [NewEvent(dead, f"dl{n}")])
    dead_letters = await cli(
        "events",
        "--stream",
        "deadletter",
        "--proxy",
        "p1",
        "-o",
        "json",
        "--nats-url",
        nats_server.url,
    )
    assert dead_letters.exit_code == 0, dead_letters.output
    assert [r["event"]["subject"] for r in json_lines(dead_letters.stdout)] == [
        "proxy.p1.cmd",
        "lease.p1",
    ]


async def test_events_of_a_proxy_without_any(
    conn: Connection, nats_server: EmbeddedNatsServer
) -> None:
    result = await cli("events", "--proxy", "nobody", "--nats-url", nats_server.url)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "no events in PROXY for proxy nobody" in result.stderr


async def test_events_rejects_a_uid_that_cannot_be_a_subject(
    nats_server: EmbeddedNatsServer,
) -> None:
    result = await cli("events", "--proxy", "p1.>", "--nats-url", nats_server.url)
    assert result.exit_code == 2
    assert "--proxy" in result.stderr


async def test_events_without_streams_says_how_to_create_them(
    nats_server: EmbeddedNatsServer,
) -> None:
    result = await cli("events", "--nats-url", nats_server.url)
    assert result.exit_code == 4
    assert "stream PROXY does not exist" in result.stderr
    assert "streams init" in result.stderr


async def test_events_follow_tails_until_ctrl_c(
    conn: Connection, jetstream_store: JetStreamEventStore, nats_server: EmbeddedNatsServer
) -> None:
    await seed_proxy(jetstream_store, "p1")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "services.cli.main", "events", "--follow", "-o", "json", "--proxy", "p1"),
        cwd=ROOT,
        env=clean_env(NATS_URL=nats_server.url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        replayed = [json.loads(await read_line(process.stdout)) for _ in range(4)]
        assert [r["seq"] for r in replayed] == [1, 2, 3, 4]
        await jetstream_store.append(
            subjects.proxy("p1"), [NewEvent(HealthChanged(healthy=False, reason="timeout"), "h")]
        )
        await jetstream_store.append(
            subjects.proxy("p2"), [NewEvent(HealthChanged(healthy=True), "h2")]
        )
        tailed = json.loads(await read_line(process.stdout))
        assert tailed["seq"] == 5
        assert tailed["event"] == {
            "type": "HealthChanged",
            "healthy": False,
            "reason": "timeout",
            "message": "",
            "latency_ms": 0.0,
            "provider_id": "",
        }
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 20) == 0
        assert await process.stdout.read() == b""
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_events_follow_rides_out_a_nats_server_restart(tmp_path: Path) -> None:
    """Nothing shown twice, nothing skipped: the reader starts again after the last it showed."""
    server = EmbeddedNatsServer(data_dir=tmp_path / "nats", port=free_port())
    await server.start()
    process: asyncio.subprocess.Process | None = None
    try:
        await append_health(server.url, "before")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "services.cli.main", "events", "-f", "-o", "json", "--nats-url", server.url),
            cwd=ROOT,
            env=clean_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert process.stdout is not None
        assert json.loads(await read_line(process.stdout))["event"]["reason"] == "before"
        await server.stop()
        await server.start()
        await append_health(server.url, "after")
        after = json.loads(await read_line(process.stdout))
        assert (after["seq"], after["event"]["reason"]) == (2, "after")
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 20) == 0
        assert await process.stdout.read() == b""
    finally:
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()
        await server.stop()


async def append_health(url: str, reason: str) -> None:
    conn = await connect(url)
    try:
        await ensure_streams(conn.js)
        store = JetStreamEventStore(conn.nc, conn.js)
        event = HealthChanged(healthy=True, reason=reason)
        await store.append(subjects.proxy("p1"), [NewEvent(event, reason)])
    finally:
        await conn.close()
