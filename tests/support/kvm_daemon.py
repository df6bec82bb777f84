"""A private libvirtd for the kvm tests: real daemon, real QEMU (TCG), nothing of the machine's own.

libvirtd running as root keeps its state under fixed paths (/etc/libvirt, /run/libvirt,
/var/lib/libvirt ...), so two daemons would share them. This one runs in a mount namespace of its
own where those paths are bind mounts of a temporary directory: its config, state, domains and
logs live there and vanish with it, whether or not the machine runs a libvirtd of its own. Its
socket is in the temporary directory too, outside the bind mounts, so tests (and the SSH server
standing in for a hypervisor) reach it from the normal namespace.

qemu.conf suits a container without systemd: QEMU runs as root, no security driver, no cgroups,
no per-domain mount namespaces; QEMU's output goes to files, so no virtlogd is needed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs

START_TIMEOUT = 30.0
# libvirtd's fixed paths, each replaced by a directory of the test's.
_PRIVATE = {
    "etc": "/etc/libvirt",
    "run": "/run/libvirt",
    "lib": "/var/lib/libvirt",
    "cache": "/var/cache/libvirt",
    "log": "/var/log/libvirt",
}
_QEMU_CONF = """\
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
stdio_handler = "file"
"""


def _quiet(_ctx: object, _err: object) -> None:
    """Errors are raised; without a handler libvirt also prints each one."""


libvirt.registerErrorHandler(_quiet, None)


def require_root_tools() -> None:
    """Fail loudly (never skip) when the machine lacks what these tests need."""
    missing = [
        tool
        for tool in ("libvirtd", "qemu-system-x86_64", "qemu-img", "unshare", "mount", "ip")
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None
    ]
    if missing:
        raise RuntimeError(
            f"the kvm tests need {', '.join(missing)}: install libvirt-daemon-system, "
            "qemu-system-x86, qemu-utils and iproute2 (see README.md)"
        )
    if os.geteuid() != 0:
        raise RuntimeError("the kvm tests start libvirtd and create a bridge: run them as root")


@dataclass
class LibvirtDaemon:
    root: Path
    process: subprocess.Popen[bytes]
    namespace: str = ""

    @property
    def socket(self) -> Path:
        return self.root / "sock" / "libvirt-sock"

    @property
    def uri(self) -> str:
        return f"qemu:///system?socket={self.socket}"

    def connect(self) -> libvirt.virConnect:
        return libvirt.open(self.uri)

    @property
    def log(self) -> str:
        path = self.root / "libvirtd.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def _sbin(tool: str) -> str:
    found = shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError(f"{tool} is not installed")
    return found


def start_daemon(root: Path) -> LibvirtDaemon:
    require_root_tools()
    for name in (*_PRIVATE, "sock"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "etc" / "qemu.conf").write_text(_QEMU_CONF)
    conf = root / "etc" / "libvirtd.conf"
    conf.write_text(
        f'unix_sock_dir = "{root / "sock"}"\n'
        'unix_sock_rw_perms = "0700"\n'
        'auth_unix_rw = "none"\n'
        'auth_unix_ro = "none"\n'
        f'log_outputs = "3:file:{root / "libvirtd.log"}"\n'
    )
    mounts = []
    for name, target in _PRIVATE.items():
        Path(target).mkdir(parents=True, exist_ok=True)
        mounts.append(f"mount --bind {root / name} {target}")
    script = " && ".join([*mounts, f"exec {_sbin('libvirtd')} -f {conf} --pid-file {root}/pid"])
    with (root / "stderr.log").open("wb") as stderr:
        process = subprocess.Popen(
            [_sbin("unshare"), "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    daemon = LibvirtDaemon(root, process)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"libvirtd exited with {process.returncode}: "
                f"{(root / 'stderr.log').read_text(errors='replace')}{daemon.log}"
            )
        if daemon.socket.exists():
            with contextlib.suppress(libvirt.libvirtError):
                daemon.connect().close()
                daemon.namespace = os.readlink(f"/proc/{process.pid}/ns/mnt")
                if daemon.namespace == os.readlink("/proc/self/ns/mnt"):
                    daemon.namespace = ""  # never kill the processes of our own namespace
                    stop_daemon(daemon)
                    raise RuntimeError("libvirtd did not get a mount namespace of its own")
                return daemon
        if time.monotonic() > deadline:
            stop_daemon(daemon)
            raise RuntimeError(f"libvirtd not answering within {START_TIMEOUT}s: {daemon.log}")
        time.sleep(0.1)


def _namespace_pids(namespace: str) -> list[int]:
    """Processes left in the daemon's mount namespace: the QEMUs it started."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == namespace:
                    found.append(int(entry.name))
    return found


def stop_daemon(daemon: LibvirtDaemon) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        conn = daemon.connect()
        for dom in conn.listAllDomains(0):
            with contextlib.suppress(libvirt.libvirtError):
                if dom.isActive():
                    dom.destroy()
        conn.close()
    daemon.process.terminate()
    try:
        daemon.process.wait(10)
    except subprocess.TimeoutExpired:
        daemon.process.kill()
        daemon.process.wait(10)
    for pid in _namespace_pids(daemon.namespace) if daemon.namespace else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def bridge(name: str) -> Iterator[str]:
    """A Linux bridge VMs' NICs join; removed afterwards with every neighbour entry on it."""
    ip = _sbin("ip")
    subprocess.run([ip, "link", "del", name], capture_output=True, check=False)
    subprocess.run([ip, "link", "add", name, "type", "bridge"], check=True)
    try:
        subprocess.run([ip, "link", "set", name, "up"], check=True)
        yield name
    finally:
        subprocess.run([ip, "link", "del", name], capture_output=True, check=False)


@contextlib.contextmanager
def storage_pool(daemon: LibvirtDaemon, directory: Path) -> Iterator[str]:
    """A directory pool with a name of its own, so each test sees only its volumes."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    directory.mkdir(parents=True, exist_ok=True)
    conn = daemon.connect()
    try:
        pool = conn.storagePoolDefineXML(
            f"<pool type='dir'><name>{name}</name><target><path>{directory}</path></target></pool>",
            0,
        )
        pool.create(0)
        yield name
        with contextlib.suppress(libvirt.libvirtError):
            pool.destroy()
        with contextlib.suppress(libvirt.libvirtError):
            pool.undefine()
    finally:
        conn.close()


def pool_volumes(daemon: LibvirtDaemon, pool: str) -> set[str]:
    conn = daemon.connect()
    try:
        pool_obj = conn.storagePoolLookupByName(pool)
        pool_obj.refresh(0)
        return {volume.name() for volume in pool_obj.listAllVolumes(0)}
    finally:
        conn.close()


def make_qcow2(path: Path, size: str = "64M") -> bytes:
    subprocess.run([_sbin("qemu-img"), "create", "-q", "-f", "qcow2", str(path), size], check=True)
    return path.read_bytes()
