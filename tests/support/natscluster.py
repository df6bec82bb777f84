"""A three-node JetStream cluster on loopback, from the wheel's nats-server.

Each node is an ``EmbeddedNatsServer`` (the same configuration as `egress-proxies up`: file
storage, ``sync_interval: always``, one user per service) with a cluster block whose routes name
the other two. The nodes share one ``credentials.json``, as a deployed cluster shares its Secret,
so every service logs in as its own user on whichever node it reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.credentials import CREDENTIALS_FILE
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.nats.users import ADMIN
from services.runtime.ports import free_port
from tests.support.waiting import until

CLUSTER_NAME = "egress"


@dataclass
class NatsCluster:
    nodes: list[EmbeddedNatsServer]

    @property
    def url(self) -> str:
        """Every node, comma-separated, as ``--nats-url`` takes a cluster."""
        return ",".join(node.url for node in self.nodes)

    def node_named(self, name: str) -> EmbeddedNatsServer:
        return next(node for node in self.nodes if node.server_name == name)

    async def start_node(self, node: EmbeddedNatsServer, timeout: float = 30.0) -> None:
        """Start (or restart, on its data dir and ports) one node; ready once it has recovered
        its streams and is in contact with the meta leader (its /healthz says so)."""
        await node.start(timeout=timeout)

    async def stop(self) -> None:
        await asyncio.gather(*(node.stop() for node in self.nodes))


def cluster_nodes(base: Path, size: int = 3) -> list[EmbeddedNatsServer]:
    """``size`` nodes with fixed free ports, routes to each other, and one shared users file."""
    cluster_ports = [free_port() for _ in range(size)]
    nodes = [
        EmbeddedNatsServer(
            data_dir=base / f"n{i + 1}",
            port=free_port(),
            monitor_port=free_port(),
            server_name=f"n{i + 1}",
            cluster_name=CLUSTER_NAME,
            cluster_port=cluster_ports[i],
            routes=tuple(
                f"nats-route://127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i
            ),
        )
        for i in range(size)
    ]
    nodes[0].credentials_for(ADMIN)  # writes the users file the others copy
    for node in nodes[1:]:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(nodes[0].credentials_file, node.data_dir / CREDENTIALS_FILE)
    return nodes


def monitor(node: EmbeddedNatsServer, path: str) -> dict[str, Any]:
    """A monitoring endpoint of ``node`` (``/jsz``, ``/routez``), as JSON."""
    url = f"http://{node.host}:{node.monitor_port}{path}"
    with urllib.request.urlopen(url, timeout=5) as response:
        found: dict[str, Any] = json.loads(response.read())
        return found


async def meta_leader(node: EmbeddedNatsServer) -> str | None:
    """The JetStream meta leader ``node`` knows of, None while there is none."""
    try:
        jsz = await asyncio.to_thread(monitor, node, "/jsz")
    except (OSError, ValueError):
        return None
    leader = (jsz.get("meta_cluster") or {}).get("leader")
    return leader if isinstance(leader, str) and leader else None


@contextlib.asynccontextmanager
async def running_cluster(base: Path, size: int = 3) -> AsyncIterator[NatsCluster]:
    cluster = NatsCluster(cluster_nodes(base, size))
    try:
        await asyncio.gather(*(cluster.start_node(node) for node in cluster.nodes))
        await until(
            lambda: all_agree_on_a_leader(cluster), timeout=30, what="a JetStream meta leader"
        )
        yield cluster
    finally:
        await cluster.stop()


async def all_agree_on_a_leader(cluster: NatsCluster) -> bool:
    leaders = {await meta_leader(node) for node in cluster.nodes if node.running}
    return len(leaders) == 1 and None not in leaders


async def admin_connection(cluster: NatsCluster) -> Connection:
    return await connect(cluster.url, name="test-admin")
