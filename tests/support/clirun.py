"""The CLI in-process, through click's runner, for tests that read its output and exit code.

Commands run in a worker thread: each command runs its own event loop (``asyncio.run``), while
the test's loop keeps the fixtures' connection alive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import structlog
from click.testing import CliRunner, Result

from services.cli.main import main


def restore_logging_after() -> Iterator[None]:
    """Each command points logging at the runner's captured stream; put it back afterwards
    (use as an autouse fixture)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config = structlog.get_config()
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**config)


async def cli(*args: str, **env: str | None) -> Result:
    """Invoke the CLI in a thread; an exception the CLI did not turn into an exit code fails."""
    base: dict[str, str | None] = {
        "NATS_URL": None,
        "METRICS_PORT": None,
        "COLUMNS": "220",
        "OTEL_SDK_DISABLED": "true",
    }
    runner = CliRunner()
    result = await asyncio.to_thread(runner.invoke, main, list(args), env=base | env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result
