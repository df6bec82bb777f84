"""Waiting for a condition in tests: a deadline that fails loudly, never a fixed sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

Predicate = Callable[[], Coroutine[Any, Any, bool]]


async def until(predicate: Predicate, timeout: float = 20.0, every: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        await asyncio.sleep(every)
