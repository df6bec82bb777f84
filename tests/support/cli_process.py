"""The CLI as a real process, for what needs signals (``up`` and ``events --follow`` stopped with
Ctrl-C): its environment, and reading its output line by line."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The working directory the processes run in: ``python -m services.cli.main`` finds the code."""


def clean_env(**extra: str) -> dict[str, str]:
    """The machine's NATS_URL, METRICS_PORT or OTEL_* must not change what the process does."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NATS_URL", "METRICS_PORT") and not k.startswith("OTEL_")
    }
    env.update(extra)
    return env


async def read_line(stream: asyncio.StreamReader, timeout: float = 30.0) -> str:
    line = await asyncio.wait_for(stream.readline(), timeout)
    if not line:
        raise AssertionError("the process closed its output")
    return line.decode()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, not yet reaped) does not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
