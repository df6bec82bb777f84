"""`run watcher` from the command line, and `up` leaving the watcher out unless asked."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.kube import start_kube
from tests.support.waiting import until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "KUBECONFIG")}
    return base | {"OTEL_SDK_DISABLED": "true", "METRICS_PORT": "0", "COLUMNS": "200"}


async def run_cli(*args: str, timeout: float = 60) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli.main",
        *args,
        cwd=ROOT,
        env=env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(timeout):
        out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def test_up_offers_the_watcher_only_on_request() -> None:
    code, out = await run_cli("up", "--help")
    assert code == 0
    assert "--with-watcher" in out
    assert "--kubeconfig" in out


async def test_run_watcher_with_a_missing_kubeconfig_names_the_flag(
    tmp_path: Path, nats_server: EmbeddedNatsServer
) -> None:
    missing = tmp_path / "nope.yaml"
    code, out = await run_cli(
        "run", "watcher", "--nats-url", nats_server.url, "--kubeconfig", str(missing)
    )
    assert code == 2, out
    assert "--kubeconfig" in out
    assert str(missing) in out


async def test_run_watcher_declares_a_proxy_from_the_cluster(
    tmp_path: Path, nats_server: EmbeddedNatsServer
) -> None:
    async with start_kube(tmp_path) as kube:
        kube.create(
            "crawl.example.com/v1alpha1/proxies",
            {"metadata": {"name": "de-1"}, "spec": {"provider": "local"}},
            namespace="crawl",
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.cli.main",
            "run",
            "watcher",
            "--nats-url",
            nats_server.url,
            "--kubeconfig",
            str(kube.settings.kubeconfig),
            "--lease-duration",
            "3",
            cwd=ROOT,
            env=env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:

            async def pending() -> bool:
                obj = kube.get("crawl.example.com/v1alpha1/proxies", "crawl", "de-1") or {}
                # No reconciler runs here: the status says the proxy is declared and waits.
                return (obj.get("status") or {}).get("phase") == "Pending" and bool(
                    obj["metadata"].get("finalizers")
                )

            await until(pending, timeout=30)
            lease = kube.get("coordination.k8s.io/v1/leases", "default", "egress-proxies-watcher")
            assert lease is not None
        finally:
            process.terminate()
            async with asyncio.timeout(30):
                out, _ = await process.communicate()
        assert process.returncode == 0, out.decode()
        assert b"leading" in out
