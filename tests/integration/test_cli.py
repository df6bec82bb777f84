"""The command line against real nats-servers: streams, events, run, up, and the exit codes.

Commands run in-process through click's runner, in a worker thread: each command runs its own
event loop (``asyncio.run``), while the test's loop keeps the fixtures' connection alive. What
needs signals (``up`` and ``events --follow`` stopped with Ctrl-C) runs as a real process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
from nats.js.api import StreamConfig

from events import subjects
from events.codec import HDR_EVENT_TYPE, HDR_MSG_ID
from events.errors import EventStoreError
from events.schemas import (
    CreateInstance,
    DeadLettered,
    HealthChanged,
    InstanceObserved,
    InstanceState,
    LeaseAcquired,
    LeaseReleased,
    OrphanFound,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
    SweepCompleted,
)
from events.store import NewEvent
from services.cli import registry
from services.runtime.config import Settings
from services.runtime.connection import Connection, connect
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import STREAMS, ensure_streams
from services.runtime.natsserver import EmbeddedNatsServer, free_port
from services.runtime.service import ServiceContext
from tests.support.clirun import cli, restore_logging_after

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


# ------------------------------------------------------------------------ test-only services


@dataclass
class Appender:
    """Appends ``count`` events to one proxy, then ends (or fails): enough to see that a service
    registered in the registry is built with its flags, runs, and can write to the log."""

    uid: str
    count: int
    fail: bool
    name: str = "appender"

    async def run(self, ctx: ServiceContext) -> None:
        batch = [
            NewEvent(HealthChanged(healthy=i % 2 == 0, reason=f"r{i}"), f"{self.uid}-{i}")
            for i in range(self.count)
        ]
        await ctx.store.append(subjects.proxy(self.uid), batch)
        if self.fail:
            raise EventStoreError("appender gave up on purpose")


@dataclass
class Recorder:
    """Records the flags it was built with; ends at once."""

    flags: dict[str, Any]
    name: str = "recorder"

    async def run(self, ctx: ServiceContext) -> None:
        return None


@dataclass
class Registered:
    built: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Registered:
    """Only the test services: the real ones run until stopped, and these tests need commands
    that end by themselves (the end-to-end test below runs the real ones)."""
    record = Registered()
    for name in list(registry.SERVICES):
        monkeypatch.delitem(registry.SERVICES, name)

    def appender(settings: Settings, *, uid: str, count: int, fail: bool) -> Appender:
        return Appender(uid, count, fail)

    def recorder(settings: Settings, **flags: Any) -> Recorder:
        record.built.append({"settings": settings, **flags})
        return Recorder(flags)

    monkeypatch.setitem(
        registry.SERVICES,
        "appender",
        registry.ServiceEntry(
            "appender",
            "Append health events to one proxy.",
            appender,
            options=(
                click.Option(["--uid"], required=True),
                click.Option(["--count"], type=int, default=1),
                click.Option(["--fail"], is_flag=True),
            ),
        ),
    )
    monkeypatch.setitem(
        registry.SERVICES,
        "recorder",
        registry.ServiceEntry(
            "recorder",
            "Record flags.",
            recorder,
            options=(
                click.Option(["--port"], type=int, default=1),
                click.Option(["--providers-config"], default=None),
            ),
            up_names={"port": "api_port"},
        ),
    )
    return record


# ---------------------------------------------------------------------------------- seeding


async def seed_proxy(store: JetStreamEventStore, uid: str) -> None:
    spec = ProxySpec(provider="local")
    await store.append(
        subjects.proxy(uid),
        [
            NewEvent(
                ProxyDeclared(uid=uid, namespace="crawl", name=f"n-{uid}", spec=spec), f"{uid}-d"
            ),
            NewEvent(
                CreateInstance(
                    command_id="c1", provider="local", instance_name=f"i-{uid}", spec=spec
                ),
                f"{uid}-c1",
            ),
            NewEvent(
                InstanceObserved(
                    command_id="c1",
                    provider="local",
                    provider_id=f"i-{uid}",
                    state=InstanceState.RUNNING,
                    ip="10.1.2.3",
                ),
                f"{uid}-o1",
            ),
            NewEvent(PhaseChanged(phase=Phase.READY, ip="10.1.2.3"), f"{uid}-ready"),
        ],
    )


async def publish_raw(conn: Connection, subject: str, data: bytes, event_type: str) -> None:
    headers = {HDR_EVENT_TYPE: event_type, HDR_MSG_ID: f"raw-{subject}-{event_type}"}
    await conn.js.publish(subject, data, headers=headers)


async def seed_with_poison(conn: Connection, store: JetStreamEventStore) -> None:
    """p1 gets four good events, one from a newer writer and one broken; p2 one good event."""
    await seed_proxy(store, "p1")
    await publish_raw(conn, "proxy.p1.status", b'{"type":"Teleported","to":"moon"}', "Teleported")
    await publish_raw(
        conn, "proxy.p1.health", b'{"type":"HealthChanged","healthy":3}', "HealthChanged"
    )
    await seed_proxy(store, "p2")


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------- streams


async def test_streams_init_creates_then_reports_existing(
    nats_server: EmbeddedNatsServer,
) -> None:
    first = await cli("streams", "init", "--nats-url", nats_server.url)
    assert first.exit_code == 0, first.output
    for spec in STREAMS:
        assert f"{spec.name}: created" in first.stdout
    second = await cli("streams", "init", "--nats-url", nats_server.url)
    assert second.exit_code == 0, second.output
    for spec in STREAMS:
        assert f"{spec.name}: exists" in second.stdout
    assert "created" not in second.stdout


async def test_streams_init_refuses_a_stream_configured_differently(
    nats_server: EmbeddedNatsServer,
) -> None:
    conn = await connect(nats_server.url)
    try:
        await conn.js.add_stream(StreamConfig(name="PROXY", subjects=["proxy.*.*"], max_age=60))
    finally:
        await conn.close()
    result = await cli("streams", "init", "--nats-url", nats_server.url)
    assert result.exit_code == 4
    assert "stream PROXY exists with a different configuration" in result.stderr
    assert "max_age" in result.stderr
    assert "Traceback" not in result.output


async def test_streams_init_rejects_an_impossible_replica_count(
    nats_server: EmbeddedNatsServer,
) -> None:
    result = await cli("streams", "init", "--replicas", "2", "--nats-url", nats_server.url)
    assert result.exit_code == 2
    assert "--stream-replicas / STREAM_REPLICAS: 2" in result.stderr


async def test_streams_info_shows_each_stream(
    nats_server: EmbeddedNatsServer,
) -> None:
    before = await cli("streams", "info", "--nats-url", nats_server.url)
    assert before.exit_code == 0, before.output
    assert before.stdout.count("missing") == len(STREAMS)

    conn = await connect(nats_server.url)
    try:
        await cli("streams", "init", "--nats-url", nats_server.url)
        await seed_proxy(JetStreamEventStore(conn.nc, conn.js), "p1")
    finally:
        await conn.close()
    after = await cli("streams", "info", "--nats-url", nats_server.url)
    assert after.exit_code == 0, after.output
    assert "MESSAGES" in after.stdout
    assert "CONSUMERS" in after.stdout
    proxy_row = next(line for line in after.stdout.splitlines() if "PROXY" in line)
    figures = proxy_row.replace("│", " ").split()
    assert figures[:3] == ["PROXY", "proxy.*.*", "4"]
    assert figures[-4:] == ["1", "4", "1", "0"]
    lease_row = next(line for line in after.stdout.splitlines() if "LEASE" in line)
    assert "lease.*" in lease_row
    assert "missing" not in after.stdout


# ----------------------------------------------------------------------------------- events


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


# ----------------------------------------------------------------------------- exit codes


async def test_unknown_service_lists_the_known_ones(registered: Registered) -> None:
    result = await cli("run", "nonesuch")
    assert result.exit_code == 2
    assert "unknown service 'nonesuch'; known: appender, recorder" in result.stderr


async def test_bad_nats_url_names_the_flag() -> None:
    result = await cli("events", "--nats-url", "http://127.0.0.1:4222")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --nats-url / NATS_URL: 'http://127.0.0.1:4222'")
    assert len(result.stderr.splitlines()) == 1


async def test_bad_nats_url_from_the_environment() -> None:
    result = await cli("streams", "info", NATS_URL="nats://")
    assert result.exit_code == 2
    assert "--nats-url / NATS_URL" in result.stderr


@pytest.mark.parametrize(
    "command",
    [("events",), ("streams", "info"), ("streams", "init"), ("run", "appender", "--uid", "x")],
)
async def test_unreachable_nats_exits_3(registered: Registered, command: tuple[str, ...]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    result = await cli(*command, "--nats-url", url)
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith(f"error: cannot reach nats-server at {url}")
    assert "Traceback" not in result.output


async def test_help_documents_the_exit_codes() -> None:
    result = await cli("--help")
    assert result.exit_code == 0
    for line in ("2  bad usage", "3  nats-server unreachable", "4  event log", "5  the embedded"):
        assert line in result.stdout
    version = await cli("--version")
    assert version.stdout.strip() == "egress-proxies, version 0.1.0"


# ------------------------------------------------------------------------------ run and up


async def test_run_starts_a_registered_service_with_its_flags(
    registered: Registered,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    nats_server: EmbeddedNatsServer,
) -> None:
    result = await cli(
        "run",
        "appender",
        "--uid",
        "p7",
        "--count",
        "3",
        "--metrics-port",
        "0",
        "--nats-url",
        nats_server.url,
    )
    assert result.exit_code == 0, result.output
    history = await jetstream_store.read(subjects.proxy("p7"))
    assert [r.event for r in history.events] == [
        HealthChanged(healthy=True, reason="r0"),
        HealthChanged(healthy=False, reason="r1"),
        HealthChanged(healthy=True, reason="r2"),
    ]
    recorded = await cli(
        "run", "recorder", "--port", "1234", "--metrics-port", "0", "--nats-url", nats_server.url
    )
    assert recorded.exit_code == 0, recorded.output
    built = registered.built[-1]
    assert built["port"] == 1234
    assert built["settings"].service_name == "egress-proxies-recorder"
    assert built["settings"].nats_url == nats_server.url


async def test_run_maps_a_failing_service_to_its_exit_code(
    registered: Registered, nats_server: EmbeddedNatsServer
) -> None:
    result = await cli(
        "run",
        "appender",
        "--uid",
        "p8",
        "--fail",
        "--metrics-port",
        "0",
        "--nats-url",
        nats_server.url,
    )
    assert result.exit_code == 4
    assert result.stderr.strip().endswith("error: appender gave up on purpose")


async def test_run_help_lists_the_services_and_their_flags(registered: Registered) -> None:
    listing = await cli("run", "--help")
    assert "appender" in listing.stdout
    assert "recorder" in listing.stdout
    one = await cli("run", "appender", "--help")
    for flag in ("--uid", "--count", "--fail", "--nats-url", "--metrics-port"):
        assert flag in one.stdout


async def test_up_passes_each_service_its_flags(
    registered: Registered,
    tmp_path: Path,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    nats_server: EmbeddedNatsServer,
) -> None:
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers: {}\n")
    helped = await cli("up", "--help")
    for flag in ("--uid", "--count", "--fail", "--api-port", "--providers-config"):
        assert flag in helped.stdout
    # The recorder's --port is fed by --api-port in `up`; shown twice it would be ambiguous.
    assert re.search(r"(?<![\w-])--port\b", helped.stdout) is None
    result = await cli(
        "up",
        *("--uid", "p9", "--count", "2", "--api-port", "9999"),
        *("--providers-config", str(providers), "--metrics-port", "0"),
        *("--data-dir", str(tmp_path / "data"), "--nats-url", nats_server.url),
    )
    assert result.exit_code == 0, result.output
    assert "appender, recorder" in result.stdout
    assert nats_server.url in result.stdout
    assert "(external)" in result.stdout
    assert not (tmp_path / "data").exists()
    history = await jetstream_store.read(subjects.proxy("p9"))
    assert len(history.events) == 2
    built = registered.built[-1]
    assert built["port"] == 9999
    assert built["providers_config"] == providers


async def test_up_refuses_a_nats_port_with_an_external_server(tmp_path: Path) -> None:
    result = await cli("up", "--nats-port", "4333", "--nats-url", "nats://127.0.0.1:4222")
    assert result.exit_code == 2
    assert "--nats-port only applies to the embedded nats-server" in result.stderr


async def test_up_requires_the_providers_file_to_exist(tmp_path: Path) -> None:
    result = await cli("up", "--providers-config", str(tmp_path / "absent.yaml"))
    assert result.exit_code == 2
    assert "--providers-config" in result.stderr


async def test_up_reports_a_busy_metrics_port(nats_server: EmbeddedNatsServer) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = await cli("up", "--metrics-port", str(port), "--nats-url", nats_server.url)
    assert result.exit_code == 2
    assert "--metrics-port" in result.stderr
    assert "choose a free port" in result.stderr


@pytest.mark.parametrize(("flag", "extra"), [("--api-port", True), ("--nats-port", False)])
async def test_up_names_the_flag_of_a_busy_port(
    nats_server: EmbeddedNatsServer, tmp_path: Path, flag: str, extra: bool
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        where = ["--nats-url", nats_server.url] if extra else ["--data-dir", str(tmp_path)]
        result = await cli("up", flag, port, "--metrics-port", "0", *where)
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "Traceback" not in result.output


# -------------------------------------------------------------------------------- end to end


def clean_env(**extra: str) -> dict[str, str]:
    """The machine's NATS_URL, METRICS_PORT or OTEL_* must not change what the process does."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NATS_URL", "METRICS_PORT") and not k.startswith("OTEL_")
    }
    env.update(extra)
    return env


async def read_line(stream: asyncio.StreamReader, timeout: float = 30.0) -> str:
    line = await asyncio.wait_for(stream.readline(), timeout)
    if not line:
        raise AssertionError("the process closed its output")
    return line.decode()


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # The command name is in parentheses and may contain spaces: parse after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_up_runs_the_system_and_stops_cleanly(tmp_path: Path, stop: signal.Signals) -> None:
    nats_port, metrics_port, api_port = free_port(), free_port(), free_port()
    data = tmp_path / "data"
    with (tmp_path / "up.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "services.cli.main", "up", "--data-dir", str(data)),
            *("--nats-port", str(nats_port), "--metrics-port", str(metrics_port)),
            *("--api-port", str(api_port)),
            cwd=ROOT,
            env=clean_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    nats_pids: list[int] = []
    try:
        assert process.stdout is not None
        banner = ""
        while "Ctrl-C to stop" not in banner:
            banner += await read_line(process.stdout)
        url = f"nats://127.0.0.1:{nats_port}"
        assert f"{url}  (embedded)" in banner
        assert f"http://127.0.0.1:{metrics_port}/metrics" in banner
        assert re.search(rf"discovery +http://127\.0\.0\.1:{api_port}", banner)
        # The tests name a check URL (conftest), so `up` serves no probe target of its own.
        assert re.search(r"health check +http://127\.0\.0\.1:9/", banner)
        running = re.search(r"services\s+(.*?)\s*│", banner)
        assert running is not None
        in_up = [name for name, entry in registry.SERVICES.items() if not entry.up_optional]
        assert sorted(running.group(1).split(", ")) == sorted(in_up)
        assert str(data.resolve()) in banner
        nats_pids = children_of(process.pid)
        assert len(nats_pids) == 1
        assert (data / "nats" / "jetstream").is_dir()

        conn = await connect(url)
        try:
            for spec in STREAMS:
                info = await conn.js.stream_info(spec.name)
                assert info.config.subjects == list(spec.subjects)
        finally:
            await conn.close()

        response = await asyncio.to_thread(
            urllib.request.urlopen, f"http://127.0.0.1:{metrics_port}/metrics", timeout=10
        )
        with response:
            assert response.status == 200
            assert b"egress_consumer_lag_messages" in response.read()

        process.send_signal(stop)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert not alive(nats_pids[0])
        logged = (tmp_path / "up.log").read_text()
        assert "Traceback" not in logged, logged
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        for pid in nats_pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
