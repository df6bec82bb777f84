"""The whole system on a real kube-apiserver: ``egress-proxies up --with-watcher`` (the local
provider) with the watcher running as its ServiceAccount from ``kubectl apply -k deploy/``, on a
token the server issued, so RBAC is the real one; the user only runs kubectl."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.watcher.pure.crdschema import FINALIZER
from tests.support.apiserver import SYSTEM_NAMESPACE, ApiServer
from tests.support.system import Up, hello_target, processes_mentioning, running_up
from tests.support.waiting import until

pytestmark = pytest.mark.e2e


def manifest(namespace: str, name: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "crawl.example.com/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "provider": "local",
                "placement": {"zone": "a"},
                "attributes": {"pool": "default"},
                "healthCheck": {"intervalSeconds": 1},
            },
        }
    )


async def kubectl(apiserver: ApiServer, *args: str, input: str | None = None) -> str:
    done = await asyncio.to_thread(apiserver.kubectl, *args, input=input)
    return done.stdout


async def proxy(apiserver: ApiServer, namespace: str, name: str) -> dict[str, Any] | None:
    return await asyncio.to_thread(apiserver.get, "px", name, namespace)


def table(text: str) -> list[dict[str, str]]:
    """``kubectl get`` output as rows by column name (no column here holds spaces)."""
    header, *lines = text.strip().splitlines()
    names = header.split()
    return [dict(zip(names, line.split(), strict=True)) for line in lines]


async def test_a_proxy_goes_ready_is_shown_by_kubectl_replaced_and_deleted(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    apiserver.deploy_base()
    namespace = apiserver.namespace("life")
    kubeconfig = apiserver.kubeconfig_for(SYSTEM_NAMESPACE, "egress-watcher")
    watcher = (
        "--with-watcher",
        f"--kubeconfig={kubeconfig}",
        f"--lease-namespace={SYSTEM_NAMESPACE}",
        "--lease-duration=3",
    )
    with hello_target() as target:
        async with running_up(
            tmp_path, "--observe-interval", "1", *watcher, health_check_url=target
        ) as up:
            await lifecycle(apiserver, namespace, tmp_path, up)


async def lifecycle(apiserver: ApiServer, namespace: str, tmp_path: Path, up: Up) -> None:
    await kubectl(apiserver, "apply", "-f", "-", input=manifest(namespace, "de-1"))

    async def shown(phase: str, health: str, generation: int) -> bool:
        obj = await proxy(apiserver, namespace, "de-1")
        status = (obj or {}).get("status") or {}
        return (
            status.get("phase") == phase
            and status.get("health") == health
            and status.get("observedGeneration") == generation
        )

    try:
        await until(lambda: shown("Ready", "Healthy", 1), timeout=60, what="Ready, Healthy")
    except AssertionError as exc:
        obj = await proxy(apiserver, namespace, "de-1")
        raise AssertionError(f"{exc}\n{obj}\n{up.output.decode()[-6000:]}") from exc
    obj = await proxy(apiserver, namespace, "de-1")
    assert obj is not None
    assert FINALIZER in obj["metadata"]["finalizers"]
    before = obj["status"]

    # The printer columns, filled.
    rows = table(await kubectl(apiserver, "get", "px", "-n", namespace))
    assert rows == [
        {
            "NAME": "de-1",
            "PHASE": "Ready",
            "IP": "127.0.0.1",
            "PROVIDER": "local",
            "HEALTH": "Healthy",
            "AGE": rows[0]["AGE"],
        }
    ]
    wide = table(await kubectl(apiserver, "get", "px", "-n", namespace, "-o", "wide"))
    assert wide[0]["URL"] == before["url"]
    assert wide[0]["REASON"] == before["reason"]
    # The short name's categories list it too.
    assert "de-1" in await kubectl(apiserver, "get", "egress", "-n", namespace)

    # describe: finalizer, conditions and the watcher's Events.
    async def described() -> str | None:
        text = await kubectl(apiserver, "describe", "px", "de-1", "-n", namespace)
        return text if "InstanceRunning" in text.split("Events:")[-1] else None

    await until(described, timeout=30, what="the InstanceRunning Event in describe")
    text = await described()
    assert text is not None
    conditions, events = text.split("Conditions:")[1].split("Events:")
    flat = " ".join(conditions.split())
    for expected in ("Type: Ready", "Type: Provisioned", "Type: Healthy", "ProbeSucceeded"):
        assert expected in flat, conditions
    assert "egress-proxies-watcher" in events
    assert FINALIZER in text.split("Spec:")[0]

    # A spec edit replaces the instance: a new instance, URL and generation.
    await kubectl(
        apiserver, "patch", "px", "de-1", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"placement": {"zone": "b"}}}),
    )  # fmt: skip

    async def replaced() -> bool:
        obj = await proxy(apiserver, namespace, "de-1")
        status = (obj or {}).get("status") or {}
        return (
            status.get("phase") == "Ready"
            and status.get("observedGeneration") == 2
            and status.get("providerID") not in (None, "", before["providerID"])
        )

    await until(replaced, timeout=60, what="the replacement")
    after = ((await proxy(apiserver, namespace, "de-1")) or {})["status"]
    assert after["url"] != before["url"]
    assert after["ip"] == "127.0.0.1"  # every local instance listens on loopback
    reasons = await kubectl(
        apiserver, "get", "events", "-n", namespace, "-o", "jsonpath={.items[*].reason}"
    )
    assert "SpecChanged" in reasons.split()

    # kubectl delete: held by the finalizer until the instance is gone.
    instances = tmp_path / "data" / "local" / "instances"
    assert (instances / after["providerID"]).is_dir()
    await kubectl(apiserver, "delete", "px", "de-1", "-n", namespace, "--wait=false")
    held = await proxy(apiserver, namespace, "de-1")
    assert held is not None
    assert held["metadata"].get("deletionTimestamp")

    async def gone() -> bool:
        return await proxy(apiserver, namespace, "de-1") is None

    await until(gone, timeout=60, what="the Proxy released by the finalizer")
    assert processes_mentioning(str((instances / after["providerID"]).resolve())) == []
    listed = await up.proxies()
    assert [p["name"] for p in listed] == []
