"""Nobody who reaches a proxy port can take the proxy down
(docs/decisions/0092-nobody-who-reaches-a-proxy.md).

A real Squid started by the local provider, with leases enforced by the real helper, a current
lease in use: malformed credentials sent to the port, and the helpers SIGKILLed again and again
(freshly started ones too, which is what Squid 5 holds fatal below ``startup=``), leave the same
Squid process serving the holder.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from services.providers import local_auth, local_process
from services.providers.local import LocalProvider
from services.providers.squidauth.keyed import lease_keyed
from services.providers.squidauth.pure import scheme
from tests.integration.test_proxy_auth import MASTER, Proxy, lease, start, status_via
from tests.support.squid_fixtures import local_squids, origin_url  # noqa: F401  # fixtures `local` and `target`
from tests.support.system import processes_mentioning
from tests.support.waiting import until

pytestmark = pytest.mark.reliability


def _basic(raw: bytes) -> bytes:
    return b"Basic " + base64.b64encode(raw)


def malformed(proxy: Proxy) -> Iterator[bytes]:
    """30 ``Proxy-Authorization`` values no helper may die of (the issue's and their kin)."""
    key = scheme.proxy_key(MASTER, proxy.uid)
    expires = time.time_ns() // 10**6 + 600_000
    user, password = scheme.lease_credential(key, "lease-x", 99, expires)
    head, _, mac = user.rpartition(".")
    bad = [
        _basic(f"{head}.{'é' * 32}:{password}".encode()),  # a mac that is not ASCII
        _basic(f"lease-x.².{expires}.{mac}:{password}".encode()),  # a digit int() refuses
        _basic(f"lease-x.1².{expires}.{mac}:{password}".encode()),
        _basic(f"lease-x.99.٣{expires}.{mac}:{password}".encode()),
        _basic(f"{scheme.PROBE_USER}.²³.{'a' * 32}:x".encode()),
        _basic(b"x" * 4096 + b":" + b"y" * 4096),  # 8 KiB of junk
        _basic("é:é".encode()),
        _basic(b"\xff\xfe\xfd:\x80\x81\x82"),  # not UTF-8 at all
        b"Basic \xff\xfe\xfd\xfc",  # raw bytes in the header itself
        _basic(user.encode() + b"\x00:" + password.encode()),
    ]
    for i in range(30):
        yield bad[i % len(bad)] + (b"" if i < len(bad) else b"=" * (i // len(bad)))


def send_raw(proxy_url: str, target: str, authorization: bytes) -> int:
    """The status Squid answers to a GET carrying ``authorization`` as sent, byte for byte; 0
    when the connection fails."""
    parts = urlsplit(proxy_url)
    host, port = parts.hostname or "", parts.port or 0
    request = (
        b"GET "
        + target.encode()
        + b" HTTP/1.1\r\nHost: "
        + urlsplit(target).netloc.encode()
        + b"\r\nProxy-Authorization: "
        + authorization
        + b"\r\nConnection: close\r\n\r\n"
    )
    try:
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(request)
            head = sock.recv(64)
    except OSError:
        return 0
    fields = head.split(b" ", 2)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def squid_pid(proxy: Proxy) -> int:
    pid = local_process.read_pid(proxy.instance_dir)
    assert local_process.is_running(pid, proxy.instance_dir), "the instance's Squid is gone"
    return pid


def squid_log(proxy: Proxy) -> str:
    """What Squid logged, helpers' stderr included: cache.log, or the instance's log when
    Squid's user could not open cache.log (a test's private temporary directory)."""
    texts = []
    for name in ("cache.log", local_process.LOG_FILE):
        path = proxy.instance_dir / name
        if path.exists():
            texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


def helpers(proxy: Proxy) -> list[int]:
    mine = set(processes_mentioning(str(proxy.instance_dir) + os.sep))
    return [pid for pid in processes_mentioning(local_auth.HELPER_FILE) if pid in mine]


async def holder_served(holder: str, target: str, times: int) -> None:
    statuses = [await asyncio.to_thread(status_via, holder, target) for _ in range(times)]
    assert statuses == [200] * times


async def test_malformed_credentials_leave_squid_serving_the_holder(
    local: LocalProvider, target: str
) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, "px-flood")
    holder = lease(proxy, 10, 300)
    assert await asyncio.to_thread(status_via, holder, target) == 200
    before = squid_pid(proxy)
    for value in malformed(proxy):
        status = await asyncio.to_thread(send_raw, proxy.url, target, value)
        assert status in {400, 407}, f"{value[:40]!r} answered {status}"
    await holder_served(holder, target, 20)
    assert squid_pid(proxy) == before
    log = squid_log(proxy)
    assert "FATAL" not in log
    assert "crashing too rapidly" not in log
    assert "Traceback" not in log
    assert "egress lease helper: refused" in log
    key = scheme.proxy_key(MASTER, proxy.uid)
    assert str(urlsplit(holder).password) not in log
    assert str(urlsplit(holder).username).rpartition(".")[2] not in log
    assert key.hex() not in log


async def test_helpers_killed_again_and_again_leave_squid_serving_the_holder(
    local: LocalProvider, target: str
) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, "px-kill")
    holder = lease(proxy, 10, 300)
    assert await asyncio.to_thread(status_via, holder, target) == 200
    before = squid_pid(proxy)
    for round_ in range(6):
        killed = helpers(proxy)
        assert killed, f"round {round_}: no helper running"
        for pid in killed:
            os.kill(pid, signal.SIGKILL)

        def replaced(killed: list[int] = killed) -> bool:
            return bool(set(helpers(proxy)) - set(killed))

        # Squid replaces a dead helper at once: the next round kills one that has answered
        # nothing yet, the case Squid 5 ends itself for below ``startup=``.
        await until(replaced, 10, what=f"round {round_}: a new helper")
        assert squid_pid(proxy) == before
    # Kept as a sleep: the time passing is the condition. Past credentialsttl, the holder is
    # checked by a new helper; nothing marks Squid's cached answer expiring.
    await asyncio.sleep(1.5)
    await holder_served(holder, target, 20)
    assert squid_pid(proxy) == before
    assert "FATAL" not in squid_log(proxy)
