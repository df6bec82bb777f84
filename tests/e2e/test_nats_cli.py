"""The event log read with the real ``nats`` CLI, as docs/nats-cli.md tells an operator to: `up`
runs, a proxy is applied and leased, and the CLI (with the reader's context file `up` writes) lists
the streams, replays the proxy's history and its leases and fetches single messages; with the
admin's, it is refused the operations the streams deny. Its view must agree with
``egress-proxies events``."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.natscli import NatsCli
from tests.support.system import Up, hello_target, processes_mentioning, running_up
from tests.support.waiting import until

pytestmark = pytest.mark.e2e

MANIFEST = """apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: nc-1, namespace: crawl}
spec:
  provider: local
  attributes: {country: de}
"""

STREAMS = {"PROXY", "LEASE", "GC", "DEADLETTER"}
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
VIEW_START = re.compile(r"^\[(\d+)\] Subject: (\S+) Received: ")
# Tracing on in `up` (spans go to its own output), so the services' events carry traceparent.
TRACING = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "egress-proxies"}


@dataclass
class Message:
    seq: int
    subject: str
    headers: dict[str, str] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def type(self) -> str:
        return self.headers.get("Egress-Event-Type", "")

    def row(self) -> tuple[int, str, str]:
        return self.seq, self.subject, self.type


def trace_id(message: Message) -> str:
    found = TRACEPARENT.match(message.headers.get("traceparent", ""))
    assert found, message
    return found[1]


def parse_view(text: str) -> list[Message]:
    """``[seq] Subject: s Received: t``, a blank line, ``  Header: value`` lines, the payload."""
    messages: list[Message] = []
    current: Message | None = None
    for line in text.splitlines():
        start = VIEW_START.match(line)
        if start:
            current = Message(int(start[1]), start[2])
            messages.append(current)
        elif current is None or not line.strip():
            continue
        elif line.startswith("  ") and not current.payload:
            name, _, value = line.strip().partition(": ")
            current.headers[name] = value
        elif not current.payload:
            current.payload = json.loads(line)
    return messages


def parse_dump(raw: str) -> list[Message]:
    """``nats sub --dump=-``: one JSON record per message, NUL-terminated; the stream sequence
    is the sixth token of the JetStream reply subject ($JS.ACK.<stream>.<consumer>.<n>.<seq>)."""
    messages = []
    for record in filter(None, raw.split("\0")):
        got = json.loads(record)
        headers = {name: values[0] for name, values in (got["Header"] or {}).items()}
        payload = json.loads(base64.b64decode(got["Data"]))
        messages.append(Message(int(got["Reply"].split(".")[5]), got["Subject"], headers, payload))
    return messages


def parse_header_block(raw: bytes) -> dict[str, str]:
    """The NATS/1.0 header block ``nats stream get --json`` gives base64-encoded."""
    lines = raw.decode().split("\r\n")
    assert lines[0].startswith("NATS/1.0"), lines
    return dict(line.split(": ", 1) for line in lines[1:] if line)


async def events_of(up: Up, uid: str, stream: str) -> list[tuple[int, str, str]]:
    done = await up.cli("events", "--proxy", uid, "--stream", stream, "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert all("skipped" not in r for r in records), records
    return [(r["seq"], r["subject"], r["type"]) for r in records]


async def test_operator_replays_a_proxy_with_the_nats_cli(tmp_path: Path) -> None:
    manifest = tmp_path / "proxies.yaml"
    manifest.write_text(MANIFEST)
    with hello_target() as target:
        async with running_up(tmp_path, health_check_url=target, up_env=TRACING) as up:
            await replay_with_the_nats_cli(up, manifest, tmp_path / "home")
    instances = (tmp_path / "data" / "local" / "instances").resolve()
    assert processes_mentioning(str(instances)) == []


async def replay_with_the_nats_cli(up: Up, manifest: Path, home: Path) -> None:
    applied = await up.cli("apply", "-f", str(manifest), "--wait")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (proxy,) = await up.proxies()
    uid = proxy["uid"]

    leased = await up.cli(
        "lease", "acquire", "--selector", "country=de", "--ttl", "60",
        "--holder", "nats-cli-e2e", "--api-url", up.api, "-o", "json",
    )  # fmt: skip
    assert leased.returncode == 0, leased.stdout + leased.stderr
    lease_id = json.loads(leased.stdout)["id"]
    released = await up.cli("lease", "release", lease_id, "--api-url", up.api)
    assert released.returncode == 0, released.stdout + released.stderr

    # The context files `up` writes (docs/operations.md) are all the nats CLI needs: the
    # reader's for everything read here, the admin's only to show what the streams refuse.
    context = up.data_dir / "nats" / "nats-reader-context.json"
    admin_context = up.data_dir / "nats" / "nats-context.json"
    for path in (context, admin_context):
        assert path.stat().st_mode & 0o077 == 0, f"{path.name} holds a password"
    assert json.loads(context.read_text())["user"] == "reader"
    nats = NatsCli(context, home)
    admin = NatsCli(admin_context, home)

    assert set(await nats.json("stream", "ls")) >= STREAMS

    # One proxy's whole history by subject filter, interactively and as a script would read
    # it; both agree with `egress-proxies events --proxy` (read again until nothing moves).
    views: dict[str, Any] = {}

    async def agree() -> bool:
        views["events"] = await events_of(up, uid, "PROXY")
        views["view"] = parse_view(await nats.view("PROXY", f"proxy.{uid}.>"))
        dump = await nats.ok("sub", "--stream", "PROXY", "--all", "-T", f"proxy.{uid}.>",
                             "--dump=-")  # fmt: skip
        views["dump"] = parse_dump(dump)
        return bool(
            [m.row() for m in views["view"]] == [m.row() for m in views["dump"]] == views["events"]
        )

    await until(agree, timeout=60, every=0.5, what="nats CLI and `events` agree")
    history: list[Message] = views["view"]
    types = [m.type for m in history]
    # The first decision's status, then its command (D168: a command goes last).
    assert types[:3] == ["ProxyDeclared", "PhaseChanged", "CreateInstance"], types
    assert {"InstanceCreated", "PhaseChanged", "HealthChanged"} <= set(types), types
    for message, dumped in zip(history, views["dump"], strict=True):
        assert message.subject.startswith(f"proxy.{uid}."), message
        assert message.payload["type"] == message.type, message
        assert message.headers["Egress-Schema"] == "1", message
        assert message.headers["Nats-Msg-Id"], message
        assert (message.headers, message.payload) == (dumped.headers, dumped.payload)
        # `apply` (the CLI) writes ProxyDeclared untraced; the services trace what they write.
        if message.type != "ProxyDeclared":
            assert TRACEPARENT.match(message.headers.get("traceparent", "")), message
    assert history[0].payload["uid"] == uid

    # The executor's answer continues the reconciler's trace: one trace across services.
    command = history[2]
    created = next(m for m in history if m.type == "InstanceCreated")
    assert created.headers["Egress-Causation-Id"] == command.headers["Nats-Msg-Id"]
    assert trace_id(created) == trace_id(command)

    # One message by sequence: the text form shows the headers, the JSON form round-trips.
    shown = await nats.ok("stream", "get", "PROXY", str(command.seq))
    assert "Egress-Event-Type: CreateInstance" in shown
    assert f"traceparent: {command.headers['traceparent']}" in shown
    got = await nats.json("stream", "get", "PROXY", str(command.seq))
    assert (got["seq"], got["subject"]) == (command.seq, command.subject)
    assert parse_header_block(base64.b64decode(got["hdrs"])) == command.headers
    assert json.loads(base64.b64decode(got["data"])) == command.payload

    # The proxy's leases.
    leases = parse_view(await nats.view("LEASE", f"lease.{uid}"))
    assert [m.row() for m in leases] == await events_of(up, uid, "LEASE")
    assert [m.type for m in leases] == ["LeaseAcquired", "LeaseReleased"]
    for message in leases:
        assert message.payload["lease_id"] == lease_id, message
        assert message.payload["proxy_uid"] == uid, message
        assert message.headers["Egress-Schema"] == "1", message
        assert TRACEPARENT.match(message.headers.get("traceparent", "")), message
    assert leases[0].payload["holder"] == "nats-cli-e2e"

    # Stream health, and the limits docs/nats-cli.md promises.
    info = await nats.json("stream", "info", "PROXY")
    assert info["config"]["deny_delete"] is True
    assert info["config"]["deny_purge"] is True
    assert info["state"]["messages"] >= len(history)
    assert info["state"]["last_seq"] >= history[-1].seq
    dead = await nats.json("stream", "info", "DEADLETTER")
    assert dead["state"]["messages"] == 0, "a clean run dead-letters nothing"
    # Even the admin, who may do anything else (the reader may not even ask: see
    # tests/reliability/test_nats_reader.py).
    for name in ("PROXY", "LEASE", "GC"):
        await admin.refused("stream", "purge", name, "-f", because="purge not permitted")
    await admin.refused(
        "stream", "rmm", "PROXY", str(command.seq), "-f", because="delete not permitted"
    )
    await admin.refused(
        "stream", "edit", "PROXY", "--no-deny-purge", "-f", because="can not cancel deny purge"
    )
    again = parse_view(await nats.view("PROXY", f"proxy.{uid}.>"))
    assert [m.row() for m in again][: len(history)] == [m.row() for m in history]

    deleted = await up.cli("delete", "crawl/nc-1", "--wait")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
