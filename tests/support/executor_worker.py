"""An executor replica as its own process, with a file-backed provider, so a test can SIGKILL it.

Usage: python -m tests.support.executor_worker NATS_URL STATE_FILE CREATE_DELAY

Prints ``ready`` on standard output once connected; logs go to standard error.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from services.executor.pure.policy import CommandPolicy
from services.executor.service import ExecutorService
from services.runtime.observability.logs import configure_logging
from services.runtime.service import Started, run_services
from services.runtime.settings.shared import Settings
from tests.support.file_provider import FileProvider


async def main(url: str, state: Path, create_delay: float) -> None:
    configure_logging("info")
    provider = FileProvider(state, pending_polls=1, create_delay=create_delay)
    service = ExecutorService(
        None,
        state.parent,
        observe_interval=60.0,
        providers={provider.name: provider},
        policy=CommandPolicy(poll_initial=0.05, poll_max=0.2, backoff_base=0.05),
        ack_wait=1.0,
    )

    def started(_: Started) -> None:
        print("ready", flush=True)

    await run_services([service], Settings(nats_url=url), on_started=started)


if __name__ == "__main__":
    url, state, delay = sys.argv[1:4]
    asyncio.run(main(url, Path(state), float(delay)))
