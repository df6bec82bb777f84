"""An aws proxy through `egress-proxies up`, against moto's EC2 emulator as a process of its own.

The emulator hands every instance 127.0.0.1 as its public address (``motoserver.py`` says why)
and the entry's ``proxyPort`` is the port of a local Squid standing in for the VM, so the health
probe reaches a real Squid through the address the provider reports. The Proxy goes Ready; its
instance terminated behind the system's back is replaced and the Proxy is Ready again; deleted,
its instance is terminated and GC deletes the entry's security group. The secret parts of the
credentials `up` was given appear nowhere in its output or in any event stream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.providers.aws.testing import MotoEc2
from services.providers.cloud.pure.firewall import firewall_name
from tests.support.aws_support import (
    SECRET,
    SESSION_TOKEN,
    admin,
    credentials_env,
    groups_named,
    ingress,
    moto_image,
)
from tests.support.crawl_squid import tagged_squids
from tests.support.system import Up, hello_target, running_up
from tests.support.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ENTRY = "aws-e2e"
STREAMS = ("proxy", "lease", "gc", "pool", "demand", "deadletter")
PROXY = f"""\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: ec2-1, namespace: crawl}}
spec:
  provider: {ENTRY}
  attributes: {{country: ie, cloud: aws}}
  healthCheck: {{intervalSeconds: 1}}
"""


def providers_config(endpoint: str, image: str, port: int) -> str:
    return f"""\
providers:
  - name: {ENTRY}
    type: aws
    auth: none
    aws:
      region: eu-west-1
      endpointUrl: {endpoint}
      image: {image}
      allowedClients: [127.0.0.0/8]
      proxyPort: {port}
      timeoutSeconds: 10
"""


def live_instances(ec2: Any) -> list[str]:
    reservations = ec2.describe_instances(
        Filters=[
            {"Name": "tag:egress-proxies/provider", "Values": [ENTRY]},
            {
                "Name": "instance-state-name",
                "Values": ["pending", "running", "stopping", "stopped"],
            },
        ]
    )["Reservations"]
    return [i["InstanceId"] for r in reservations for i in r["Instances"]]


async def proxy_phase(up: Up) -> str:
    status, body = await up.api_call("GET", "/v1/proxies")
    assert status == 200, body
    phases = [p["phase"] for p in body["items"] if p["name"] == "ec2-1"]
    return phases[0] if phases else ""


async def stream(up: Up, name: str) -> list[dict[str, Any]]:
    got = await up.cli("events", "--stream", name, "-o", "json")
    assert got.returncode == 0, got.stdout + got.stderr
    return [json.loads(line) for line in got.stdout.splitlines() if line.strip()]


async def test_an_aws_proxy_is_made_replaced_deleted_and_its_firewall_collected(
    tmp_path: Path,
) -> None:
    with MotoEc2(public_ips=["127.0.0.1"]) as moto:
        ec2 = admin(moto.url)
        async with tagged_squids(tmp_path / "squids", ["vm"]) as (squid,):
            providers = tmp_path / "providers.yaml"
            providers.write_text(providers_config(moto.url, moto_image(ec2), squid.port))
            manifest = tmp_path / "proxy.yaml"
            manifest.write_text(PROXY)
            flags = [
                "--providers-config", str(providers),
                "--observe-interval", "1",
                "--gc-interval", "2s",
                "--gc-grace", "1s",
            ]  # fmt: skip
            with hello_target() as target:
                async with running_up(
                    tmp_path, *flags, health_check_url=target, up_env=credentials_env()
                ) as up:
                    await _lifecycle(up, ec2, squid.port)
                    events = {name: await stream(up, name) for name in STREAMS}
            output = up.output.decode(errors="replace")

    for secret in (SECRET, SESSION_TOKEN):
        assert secret not in output
        for name, found in events.items():
            assert secret not in json.dumps(found), name
    assert "aws-e2e" in json.dumps(events["proxy"])  # the streams were read, not empty
    assert any(e["type"] == "OrphanDeleted" for e in events["gc"])


async def _lifecycle(up: Up, ec2: Any, port: int) -> None:
    applied = await up.cli("apply", "-f", str(up.data_dir.parent / "proxy.yaml"))
    assert applied.returncode == 0, applied.stdout + applied.stderr

    async def ready() -> bool:
        return await proxy_phase(up) == "Ready"

    await until(ready, timeout=60.0, what="the proxy Ready on its EC2 instance")
    (first,) = live_instances(ec2)
    (group,) = groups_named(ec2, firewall_name(ENTRY))
    assert ingress(group) == {("tcp", port, port, "127.0.0.0/8")}

    ec2.terminate_instances(InstanceIds=[first])  # behind the system's back

    async def replaced() -> bool:
        return live_instances(ec2) not in ([], [first]) and await ready()

    await until(replaced, timeout=60.0, what="a new instance, and the proxy Ready again")
    (second,) = live_instances(ec2)
    assert second != first
    created = [
        e["event"].get("provider_id") or e["event"].get("providerId")
        for e in await stream(up, "proxy")
        if e["type"] == "InstanceCreated"
    ]
    assert created[-2:] == [first, second]

    deleted = await up.cli("delete", "crawl/ec2-1", "--wait")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert live_instances(ec2) == []

    await until(
        lambda: groups_named(ec2, firewall_name(ENTRY)) == [],
        timeout=60.0,
        what="GC deleting the security group",
    )
