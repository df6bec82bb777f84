"""asyncio helpers every layer needs."""

from __future__ import annotations

import asyncio


def raise_if_cancelled() -> None:
    """Honour a cancellation that a library swallowed: nats-py drops a ``CancelledError`` that
    lands inside a publish on a closed connection, and a retry loop would then run forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
