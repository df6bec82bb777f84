"""The services of this commit beside a log older versions wrote: the golden messages
(tests/golden) published raw, headers and bytes as stored, into the streams of a real
nats-server, then read by the real CLI and discovery, and run by `up` with every service.

What a republished log cannot keep is its JetStream timestamps: every message is stamped now.
So the lease claims, stamped long after their writers' deadlines, are folded as late (as any
claim that reached the log after its deadline) and the expected lease views are the unit
test's business (tests/unit/test_golden_log.py); everything here that folds from the proxy
events must serve what the golden views say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from events.customresource import cli_uid
from events.subjects import DEADLETTER_STREAM, GC_STREAM, LEASE_STREAM, PROXY_STREAM
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.golden import logs
from tests.golden.logs import Message
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import discovery
from tests.support.system import Up, hello_target, running_up
from tests.support.waiting import until

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)

DE_1 = cli_uid("golden", "de-1")
US_1 = cli_uid("golden", "us-1")
GOLDEN = logs.log_paths()


async def publish(conn: Connection, messages: list[Message]) -> None:
    """Each message as stored, in order: the server must give it the sequence it had."""
    for m in messages:
        ack = await conn.js.publish(m.subject, m.payload, headers=m.headers)
        assert (ack.stream, ack.seq) == (m.stream, m.seq), m


def golden_views(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(logs.EXPECTED_VIEWS.read_text())[path.name]
    return found


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def check_the_cli_reads_it(url: str, messages: list[Message], tmp_path: Path) -> None:
    for stream in (PROXY_STREAM, LEASE_STREAM, GC_STREAM, DEADLETTER_STREAM):
        result = await cli("events", "--stream", stream, "-o", "json", "--nats-url", url)
        assert result.exit_code == 0, result.output
        records = json_lines(result.stdout)
        stored = [m for m in messages if m.stream == stream]
        assert [(r["seq"], r["type"]) for r in records] == [
            (m.seq, m.headers["Egress-Event-Type"]) for m in stored
        ]
        assert not [r for r in records if "skipped" in r or "error" in r]
    check = await cli("streams", "check", "--nats-url", url)
    assert check.exit_code == 0, check.output

    # `apply` learns the running system's providers from the log's newest GC sweep (D98).
    manifest = tmp_path / "elsewhere.yaml"
    manifest.write_text(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
        "metadata: {name: fr-1, namespace: golden}\nspec: {provider: elsewhere}\n"
    )
    refused = await cli("apply", "-f", str(manifest), "--nats-url", url)
    assert refused.exit_code == 2, refused.output
    assert "had: gcp-eu, local" in refused.output


def check_a_listed_proxy(item: dict[str, Any], view: dict[str, Any]) -> None:
    """A proxy as `get -o json` or `GET /v1/proxies` lists it, against its golden view."""
    assert (item["uid"], item["namespace"], item["name"]) == (view["uid"], "golden", "de-1")
    assert (item["phase"], item["ip"], item["url"]) == (view["phase"], view["ip"], view["url"])
    assert item["healthy"] is view["healthy"] is True
    assert item["attributes"] == view["spec"]["attributes"]
    assert item["provider"] == view["spec"]["provider"]
    assert item["conditions"] == view["conditions"]


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
async def test_the_cli_and_discovery_serve_a_golden_log(
    path: Path, nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    messages = logs.load(path)
    await publish(conn, messages)
    views = golden_views(path)
    await check_the_cli_reads_it(nats_server.url, messages, tmp_path)

    got = await cli("get", "-o", "json", "--nats-url", nats_server.url)
    assert got.exit_code == 0, got.output
    (listed,) = json.loads(got.stdout)["items"]  # us-1 was removed
    check_a_listed_proxy(listed, views["proxies"][DE_1])
    assert listed["providerID"] == views["proxies"][DE_1]["provider_id"]

    async with (
        discovery(nats_server.url) as (_, base),
        httpx.AsyncClient(base_url=base, timeout=10) as api,
    ):
        response = await api.get("/v1/proxies")
        assert response.status_code == 200, response.text
        (served,) = response.json()["items"]
        check_a_listed_proxy(served, views["proxies"][DE_1])
        assert served["latencyMs"] == views["proxies"][DE_1]["latency_ms"]
        gone = await api.get(f"/v1/proxies/{US_1}")
        assert gone.status_code == 404, gone.text


async def ready_again(up: Up, golden_instance: str) -> dict[str, Any]:
    """de-1, Ready and healthy on an instance of its own: the golden one is on no machine."""
    found: dict[str, Any] = {}

    async def ready() -> bool:
        found.clear()
        found.update({p["name"]: p for p in await up.proxies()}.get("de-1", {}))
        return (
            found.get("phase") == "Ready"
            and found.get("healthy") is True
            and found.get("providerID") not in (None, "", golden_instance)
        )

    try:
        await until(ready, timeout=90, every=0.5)
    except AssertionError as exc:
        raise AssertionError(f"de-1 never came back Ready and healthy: {found}") from exc
    return found


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
async def test_every_service_runs_on_a_golden_log_and_carries_it_on(
    path: Path, nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    """`up` on the golden streams: every service starts and folds them; de-1's instance is on no
    machine here, so the executor's observe sweep records it gone and the reconciler makes it a
    new one, which health probes; discovery then leases it, with a fencing token above every
    sequence of the golden lease stream."""
    messages = logs.load(path)
    await publish(conn, messages)
    golden = golden_views(path)["proxies"][DE_1]
    lease_seqs = [m.seq for m in messages if m.stream == LEASE_STREAM]
    with hello_target() as target:
        async with running_up(
            tmp_path, "--observe-interval", "1", nats_url=nats_server.url, health_check_url=target
        ) as up:
            proxy = await ready_again(up, golden["provider_id"])
            assert (proxy["uid"], proxy["generation"]) == (DE_1, golden["generation"])
            assert [p["name"] for p in await up.proxies()] == ["de-1"]
            shown = await up.cli("events", "--proxy", DE_1, "-o", "json")
            assert shown.returncode == 0, shown.stdout + shown.stderr
            records = json_lines(shown.stdout)
            last_golden = golden["last_seq"]
            assert [r["seq"] for r in records if r["seq"] <= last_golden] == [
                m.seq for m in messages if m.subject.startswith(f"proxy.{DE_1}.")
            ]
            carried_on = {r["type"] for r in records if r["seq"] > last_golden}
            assert {"InstanceGone", "CreateInstance", "InstanceObserved"} <= carried_on

            status, lease = await up.api_call(
                "POST", "/v1/leases", {"selector": {"country": "de"}, "ttlSeconds": 30}
            )
            assert status == 201, lease
            assert lease["proxy"]["uid"] == DE_1
            assert lease["fencingToken"] > max(lease_seqs)
            status, _ = await up.api_call("DELETE", f"/v1/leases/{lease['id']}")
            assert status == 204

            log = up.output.decode()
            assert "Traceback" not in log
            assert "skipped an event" not in log, log[-4000:]
