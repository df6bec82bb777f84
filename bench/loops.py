"""The event loop a benchmark worker runs on: uvloop, as `up` and `run` start the services
(``--event-loop``, docs/decisions/0089-discovery-s-views-follow-by.md), unless a run asks for the
standard one to compare."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable

LOOPS = ("uvloop", "asyncio")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """None for the standard loop; uvloop's otherwise."""
    if name == "asyncio":
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = importlib.import_module(name).new_event_loop
    return factory
