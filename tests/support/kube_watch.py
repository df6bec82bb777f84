"""Watch streams of the test apiserver (``tests.support.kube_emulator``): from "now" with the
current objects as ADDED, or resumed after a resourceVersion from the server's history; 410 below
the compaction floor; bookmarks; a server-side timeout; ended early by ``end_watches``."""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.kube_emulator import ApiServerEmulator, Obj, ResourceType


@dataclass(slots=True)
class Watch:
    """An open watch, so the server can end it."""

    resource: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    gone: bool = False


async def watch_stream(
    server: ApiServerEmulator,
    rtype: ResourceType,
    wanted: Callable[[Obj], bool],
    params: dict[str, str],
) -> AsyncIterator[Any]:
    """One watch request's response body: events as JSON lines, until the client goes away."""
    since = params.get("resourceVersion", "")
    bookmarks = params.get("allowWatchBookmarks", "").lower() in ("true", "1")
    timeout = float(params.get("timeoutSeconds") or 0)
    deadline = time.monotonic() + timeout if timeout > 0 else None
    watch = Watch(rtype.key)
    server.watches.append(watch)
    try:
        yield b""  # send the headers now: a watch may legitimately see nothing for a while
        if since in ("", "0"):
            position = server.revision
            for (res, _, _), obj in sorted(server.store.items()):
                if res == rtype.key and wanted(obj):
                    yield {"type": "ADDED", "object": obj}
        elif int(since) < server.compacted:
            yield _gone(since)
            return
        else:
            position = int(since)
        last_bookmark = time.monotonic()
        while not watch.stop.is_set():
            changed = server.changed
            # History is in resourceVersion order: start after the last one delivered.
            start = bisect.bisect_right(server.history, position, key=lambda entry: entry[0])
            for rv, res, event in server.history[start:]:
                position = rv
                if res == rtype.key and wanted(event["object"]):
                    yield event
            wait = server.bookmark_interval if bookmarks else 3600.0
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return
            stop = asyncio.ensure_future(watch.stop.wait())
            change = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait(
                    {stop, change}, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stop.cancel()
                change.cancel()
            if bookmarks and time.monotonic() - last_bookmark >= server.bookmark_interval:
                last_bookmark = time.monotonic()
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": rtype.api_version,
                        "kind": rtype.kind,
                        "metadata": {"resourceVersion": str(position)},
                    },
                }
        if watch.gone:
            yield _gone(str(position))
    finally:
        server.watches.remove(watch)


def _gone(since: str) -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {since}",
            "reason": "Expired",
            "code": 410,
        },
    }
