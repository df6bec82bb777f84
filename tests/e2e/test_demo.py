"""The README's demo, end to end: `up`, then `apply` five local proxies, traffic through each
(leased: a proxy serves only its lease's holder), `delete`. Everything is real: the CLI as
subprocesses, nats-server, Squid (or proxy.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from services.runtime.ports import free_port
from tests.support.system import ROOT, cli, fetch_via, hello_target, processes_mentioning
from tests.support.waiting import until

pytestmark = pytest.mark.e2e

PROXIES = "\n---\n".join(
    f"""apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: demo-{i}, namespace: e2e}}
spec:
  provider: local
  attributes: {{slot: "{i}"}}
"""
    for i in range(5)
)


@pytest.fixture
def target() -> Iterator[str]:
    with hello_target() as url:
        yield url


async def test_up_apply_traffic_delete(tmp_path: Path, target: str) -> None:
    data_dir = tmp_path / "data"
    nats_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_URL", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT)
    up = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli.main",
        "up",
        "--data-dir",
        str(data_dir),
        "--nats-port",
        str(nats_port),
        "--metrics-port",
        "0",
        "--api-port",
        str(api_port := free_port()),
        "--gateway-port",
        str(gateway_port := free_port()),
        "--observe-interval",
        "1",
        "--health-check-url",
        target,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    url = f"nats://127.0.0.1:{nats_port}"
    cli_env = {**env, "NATS_URL": url, "DISCOVERY_URL": f"http://127.0.0.1:{api_port}"}
    manifest = tmp_path / "proxies.yaml"
    manifest.write_text(PROXIES)
    try:
        assert up.stdout is not None
        banner = b""
        async with asyncio.timeout(60):
            while url.encode() not in banner:
                line = await up.stdout.readline()
                assert line, f"up exited early:\n{banner.decode()}"
                banner += line

        applied = await asyncio.to_thread(cli, "apply", "-f", str(manifest), "--wait", env=cli_env)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert applied.stdout.count(" created") == 5
        # Into a pipe, one line per proxy and nothing else (no progress bar, no blank line).
        assert applied.stdout.splitlines() == [f"proxy e2e/demo-{i} created" for i in range(5)]

        listed = await asyncio.to_thread(cli, "get", "-o", "json", env=cli_env)
        assert listed.returncode == 0, listed.stderr
        items = json.loads(listed.stdout)["items"]
        assert sorted(i["name"] for i in items) == [f"demo-{i}" for i in range(5)]
        assert {i["phase"] for i in items} == {"Ready"}

        async def all_healthy() -> bool:
            got = await asyncio.to_thread(cli, "get", "-o", "json", env=cli_env)
            return {i["healthy"] for i in json.loads(got.stdout)["items"]} == {True}

        await until(all_healthy, timeout=60)
        assert len({i["url"] for i in items}) == 5
        for item in items:
            # Only a lease's holder may use a proxy (D84): its URL carries the credentials.
            with pytest.raises(urllib.error.HTTPError, match="407") as refused:
                await asyncio.to_thread(fetch_via, item["url"], target)
            refused.value.close()  # it holds the response's socket until closed
            slot = f"slot={item['attributes']['slot']}"
            got = await asyncio.to_thread(
                cli, "lease", "acquire", "--selector", slot, "--ttl", "60", "-o", "json",
                env=cli_env,
            )  # fmt: skip
            assert got.returncode == 0, got.stdout + got.stderr
            lease = json.loads(got.stdout)
            assert await asyncio.to_thread(fetch_via, lease["proxy"]["url"], target) == (
                "hello through the proxy"
            )
            released = await asyncio.to_thread(cli, "lease", "release", lease["id"], env=cli_env)
            assert released.returncode == 0, released.stdout + released.stderr

        # `up`'s gateway: without a clients file it serves loopback without a login, so curl
        # needs no more than the gateway's address; a user name is a label with parameters.
        gateway = f"127.0.0.1:{gateway_port}"
        for proxy, through in ((gateway, "e2e/demo-"), (f"demo-slot-3@{gateway}", "e2e/demo-3")):
            # The proxies were just released: each is free again after the lease cooldown.
            await until(
                partial(_through_gateway, proxy, target, through),
                timeout=30,
                what=f"curl -x http://{proxy} answered through {through}",
            )

        story = await asyncio.to_thread(
            cli, "events", "--proxy", items[0]["uid"], "-o", "json", env=cli_env
        )
        types = [json.loads(line)["type"] for line in story.stdout.splitlines() if line.strip()]
        assert types[0] == "ProxyDeclared"
        assert "CreateInstance" in types
        assert "InstanceObserved" in types
        assert "PhaseChanged" in types[types.index("InstanceObserved") :]
        assert "HealthChanged" in types

        instances = data_dir / "local" / "instances"
        assert processes_mentioning(str(instances)), (
            "the proxies run as processes under the data dir"
        )
        deleted = await asyncio.to_thread(cli, "delete", "-f", str(manifest), "--wait", env=cli_env)
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        assert "" not in deleted.stdout.splitlines(), deleted.stdout
        assert processes_mentioning(str(instances)) == []
        assert not any(instances.iterdir())
        listed = await asyncio.to_thread(cli, "get", "-o", "json", env=cli_env)
        assert json.loads(listed.stdout)["items"] == []
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
            async with asyncio.timeout(30):
                await up.wait()
    assert up.returncode == 0


async def _through_gateway(proxy: str, target: str, through: str) -> bool:
    """Whether curl through the gateway got the target's page from a proxy named ``through``;
    a refusal of the gateway's own (no proxy free yet) is an answer to wait past."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    got = await asyncio.to_thread(
        subprocess.run,
        ["curl", "-sS", "-i", "--max-time", "10", "-x", f"http://{proxy}", target],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
        env=env,
    )
    if "X-Egress-Error" in got.stdout:
        return False
    assert got.stdout.startswith("HTTP/1.1 200"), got.stdout + got.stderr
    assert f"X-Egress-Proxy: {through}" in got.stdout, got.stdout
    assert got.stdout.endswith("hello through the proxy"), got.stdout
    return True
