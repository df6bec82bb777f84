"""Addresses for VMs that have no guest OS: entries in the host's real ARP (neighbour) table.

The test VMs boot an empty disk, so nothing in them ever answers ARP or runs a guest agent. The
provider reads addresses the way it does on a real hypervisor, through libvirt's ARP source, which
reads the kernel's neighbour table; this watcher writes an entry there for every running domain's
MAC on the test bridge (state STALE: libvirt reads only STALE and REACHABLE entries).

One wrinkle of this machine, not of the provider: libvirt up to 10.x parses only the first buffer
of the kernel's neighbour dump and fails with "wrong nlmsg len" when that buffer also carries the
end-of-dump message, which newer kernels fold into the last buffer. The watcher therefore pads the
table with PERMANENT entries (which libvirt skips) so the dump spans several buffers, and keeps
the VMs' entries near its front, where libvirt reads them. On a hypervisor with an older kernel or
a fixed libvirt none of this is needed; the provider treats the error as "no address yet" either
way.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs

from tests.support.kvm_daemon import LibvirtDaemon

# libvirt 9 reads about 40 entries from the first buffer; stay well inside it.
FRONT = 16
MIN_ENTRIES = 120
_VM_NET = ipaddress.ip_network("10.77.0.0/16")
_PAD_NET = ipaddress.ip_network("10.78.0.0/16")


def _ip() -> str:
    found = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError("the kvm tests need iproute2's ip")
    return found


class ArpTable:
    """The entries this test wrote, on one bridge."""

    def __init__(self, bridge: str) -> None:
        self.bridge = bridge
        self.assigned: dict[str, str] = {}  # MAC -> IP
        self._pads = (str(a) for a in _PAD_NET.hosts())
        self._ips = (str(a) for a in _VM_NET.hosts())

    def _batch(self, lines: list[str]) -> None:
        if lines:
            subprocess.run(
                [_ip(), "-force", "-batch", "-"],
                input="".join(line + "\n" for line in lines),
                text=True,
                capture_output=True,
                check=False,
            )

    def _order(self) -> list[str]:
        out = subprocess.run(
            [_ip(), "neigh", "show"], capture_output=True, text=True, check=True
        ).stdout
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def pin(self, macs: set[str]) -> None:
        """Every MAC in ``macs`` has an address libvirt can read."""
        lines = []
        for mac in sorted(macs):
            ip = self.assigned.setdefault(mac, next(self._ips))
            lines.append(f"neigh replace {ip} lladdr {mac} dev {self.bridge} nud stale")
        self._batch(lines)
        targets = {self.assigned[mac] for mac in macs}
        for _ in range(20):
            order = self._order()
            positions = [i for i, ip in enumerate(order) if ip in targets]
            last = max(positions, default=-1)
            if last < FRONT and len(order) >= MIN_ENTRIES:
                return
            ahead = [ip for ip in order[: last + 1] if ipaddress.ip_address(ip) in _PAD_NET]
            self._batch([f"neigh del {ip} dev {self.bridge}" for ip in ahead])
            missing = MIN_ENTRIES + len(ahead) - len(order)
            self._batch(
                [
                    f"neigh replace {next(self._pads)} lladdr 02:00:00:00:00:01 "
                    f"dev {self.bridge} nud permanent"
                    for _ in range(max(missing, 0))
                ]
            )


def _running_macs(daemon: LibvirtDaemon, bridge: str) -> set[str]:
    macs = set()
    conn = daemon.connect()
    try:
        for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            with contextlib.suppress(libvirt.libvirtError, ET.ParseError):
                root = ET.fromstring(dom.XMLDesc(0))
                for nic in root.iter("interface"):
                    source, mac = nic.find("source"), nic.find("mac")
                    if source is not None and mac is not None and source.get("bridge") == bridge:
                        macs.add(mac.get("address", "").lower())
    finally:
        conn.close()
    return macs


@contextlib.asynccontextmanager
async def arp_watcher(
    daemon: LibvirtDaemon, bridge: str, interval: float = 0.2
) -> AsyncIterator[ArpTable]:
    """Gives every running domain on ``bridge`` an address, as long as the context lasts."""
    table = ArpTable(bridge)

    def tick() -> None:
        macs = _running_macs(daemon, bridge)
        if macs:
            table.pin(macs)

    async def watch() -> None:
        while True:
            await asyncio.to_thread(tick)
            await asyncio.sleep(interval)

    task = asyncio.create_task(watch())
    try:
        yield table
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.to_thread(
            subprocess.run, [_ip(), "neigh", "flush", "dev", bridge], capture_output=True
        )
