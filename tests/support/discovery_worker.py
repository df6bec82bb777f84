"""A discovery replica as its own process (own interpreter, NATS connection and projectors).

Usage: python -m tests.support.discovery_worker NATS_URL [COOLDOWN_SECONDS]

Prints ``ready <port>`` on standard output once it listens; logs (warnings up) go to standard error.
"""

from __future__ import annotations

import asyncio
import sys

from services.discovery.service import DiscoveryService
from services.runtime.observability.logs import configure_logging
from services.runtime.service import Started, run_services
from services.runtime.settings.shared import Settings


async def main(url: str, cooldown: float) -> None:
    configure_logging("warning")
    service = DiscoveryService(
        host="127.0.0.1", port=0, max_lease_ttl=60.0, lease_cooldown=cooldown, expiry_interval=0.2
    )

    async def announce() -> None:
        await service.listening.wait()
        print(f"ready {service.bound_port}", flush=True)

    pending: list[asyncio.Task[None]] = []

    def started(_: Started) -> None:
        pending.append(asyncio.get_running_loop().create_task(announce()))

    await run_services([service], Settings(nats_url=url), on_started=started)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0))
