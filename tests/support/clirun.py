"""The CLI in-process, through click's runner, for tests that read its output and exit code.

Commands run in a worker thread: each command runs its own event loop (``asyncio.run``), while
the test's loop keeps the fixtures' connection alive.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Mapping

import click
import pytest
import structlog
from click.testing import CliRunner, Result

from services.cli.main import main
from services.cli.run import up_cmd as up
from services.runtime.settings.shared import Settings


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


_ONE_AT_A_TIME = threading.Lock()


async def cli(*args: str, **env: str | None) -> Result:
    """Invoke the CLI in a thread; an exception the CLI did not turn into an exit code fails."""
    base: dict[str, str | None] = {
        "NATS_URL": None,
        "METRICS_PORT": None,
        "COLUMNS": "220",
        "OTEL_SDK_DISABLED": "true",
    }
    runner = CliRunner()
    # click's runner swaps sys.stdout and os.environ for the whole process: a second run while
    # one is under way loses output and can leave variables set for every later test.
    if not _ONE_AT_A_TIME.acquire(blocking=False):
        raise RuntimeError("a CLI run is under way in this process; run one at a time")
    try:
        result = await asyncio.to_thread(runner.invoke, main, list(args), env=base | env)
    finally:
        _ONE_AT_A_TIME.release()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def variables_of(command: click.Command) -> set[str]:
    """Every variable ``command`` reads, its group's included: a setting it has no flag for is a
    parameter too (``EnvSetting``), so none is missing."""
    names = set()
    for param in [*main.params, *command.params]:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            names.add(envvar)
    return names


def run_parsed(
    args: list[str], env: Mapping[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> tuple[Result, Settings | None]:
    """``egress-proxies run NAME [FLAGS]`` under ``env`` and no other variable it reads: the real
    command line parses and checks everything and the real factory builds the service, which
    is not run. Returns the outcome and the settings the service would have started with."""
    run = main.commands["run"]
    assert isinstance(run, click.Group)
    command = run.get_command(click.Context(run), args[1])
    assert command is not None, args
    started: list[Settings] = []
    with monkeypatch.context() as scoped:
        scoped.setattr(up, "_run_one", lambda _service, settings: started.append(settings))
        scoped.setattr(up, "run_until_signalled", lambda work, **_: work)
        # The group points logging at the runner's stream; the process keeps its own.
        scoped.setattr("services.cli.main.configure_logging", lambda *_: None)
        unset: dict[str, str | None] = dict.fromkeys(variables_of(command))
        result = CliRunner().invoke(main, args, env=unset | dict(env))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result, (started[0] if started else None)
