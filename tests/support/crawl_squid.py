"""Real Squid processes for crawl tests, each naming itself to the sites it reaches.

The product's Squid hides its clients (``via off``, ``forwarded_for delete``), so a local site
could not tell which proxy a request came through. These run the local provider's exact Squid
(its config, command line and process handling) plus one line: ``X-Egress-Proxy: <uid>`` on every
request forwarded, as a distinct egress address would tell a real site.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from services.providers import local_process as proc
from services.providers.pure.targets import AllowedTarget
from services.runtime.ports import free_port
from tests.support.waiting import until

PROXY_HEADER = "X-Egress-Proxy"


@dataclass(frozen=True, slots=True)
class TaggedSquid:
    uid: str
    port: int
    pid: int
    directory: Path

    @property
    def url(self) -> str:
        return f"http://{proc.HOST}:{self.port}"


def _start(directory: Path, uid: str, targets: Collection[AllowedTarget]) -> TaggedSquid:
    directory.mkdir(parents=True)
    port = free_port()
    command = proc.prepare(proc.SQUID, directory, port, uid, targets=targets)
    with (directory / "squid.conf").open("a") as config:
        config.write(f'request_header_add {PROXY_HEADER} "{uid}" all\n')
    return TaggedSquid(uid, port, proc.spawn(command, directory), directory)


async def _stop(squid: TaggedSquid) -> None:
    await proc.terminate(squid.pid, squid.directory, grace=1.0)
    proc.remove_leftovers(squid.directory)


@contextlib.asynccontextmanager
async def tagged_squids(
    data_dir: Path, uids: list[str], *, targets: Collection[AllowedTarget] = ()
) -> AsyncIterator[list[TaggedSquid]]:
    """One Squid per uid, each accepting connections once this yields; all stopped after.
    ``targets``: what each may reach beyond its defaults (a local site's port for CONNECT)."""
    squids: list[TaggedSquid] = []
    try:
        for uid in uids:
            squids.append(_start(data_dir / uid, uid, targets))
        for squid in squids:
            await until(
                partial(proc.accepts, squid.port), timeout=30, what=f"{squid.uid} on {squid.port}"
            )
        yield squids
    finally:
        await asyncio.gather(*(_stop(squid) for squid in squids))
