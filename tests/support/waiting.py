"""Waiting for a condition in tests: a deadline that fails loudly, never a fixed sleep."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

Predicate = Callable[[], Awaitable[bool] | bool | object]


async def until(
    predicate: Predicate, timeout: float = 20.0, every: float = 0.05, *, what: str = ""
) -> None:
    """Return once ``predicate`` (sync or async) is true; fail naming ``what`` after
    ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = predicate()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what or 'condition'} not reached within {timeout}s")
        await asyncio.sleep(every)


async def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on ``port`` now (a predicate for ``until``)."""
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    return True
