"""Lease-based leader election: of N watcher replicas, one watches and writes status.

kubernetes_asyncio's ``LeaderElection`` does the acquire/renew protocol on a
``coordination.k8s.io/v1`` Lease. Around it: a failing term ends the process (a leader that
renews its Lease but does nothing would hold the fleet hostage), a lost term goes back to
candidacy, and a stopping leader hands the Lease back so a standby takes over at once instead of
waiting for it to expire.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

log = structlog.get_logger("egress.watcher.leader")


@dataclass(frozen=True, slots=True)
class LeaderSettings:
    namespace: str = "default"
    name: str = "egress-proxies-watcher"
    lease_duration: int = 15
    """Whole seconds: the Lease stores ``leaseDurationSeconds`` as an integer."""
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str = ""


def default_identity() -> str:
    """The pod name when Kubernetes runs us (unique per replica), else host + pid + salt."""
    pod = os.environ.get("POD_NAME") or ""
    if pod:
        return pod
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Leadership:
    def __init__(self, api_client: k8s.ApiClient, settings: LeaderSettings) -> None:
        self.api_client = api_client
        self.settings = settings
        self.identity = settings.identity or default_identity()
        self.terms = 0
        self.leading = False

    async def run(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` whenever we lead, forever; raise what ``work`` raised."""
        failure: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

        terms: set[asyncio.Task[Any]] = set()

        async def term() -> None:
            current = asyncio.current_task()
            if current is not None:
                terms.add(current)
            self.terms += 1
            self.leading = True
            log.info("leading", identity=self.identity, lease=self.settings.name)
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                if not failure.done():
                    failure.set_result(exc)
            finally:
                self.leading = False

        async def stopped() -> None:
            log.info("leadership lost", identity=self.identity)

        s = self.settings
        lock = LeaseLock(s.name, s.namespace, self.identity, self.api_client)
        config = electionconfig.Config(
            lock, s.lease_duration, s.renew_deadline, s.retry_period, term, stopped
        )
        election: asyncio.Future[None] | None = None
        try:
            while True:
                election = asyncio.ensure_future(leaderelection.LeaderElection(config).run())
                waiting: set[asyncio.Future[Any]] = {election, failure}
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if failure in done:
                    raise failure.result()
                error = election.exception()
                if error is not None:
                    # e.g. the apiserver unreachable: the library raises instead of retrying.
                    log.warning("leader election failed, standing again", error=repr(error))
                    await asyncio.sleep(s.retry_period)
                # else: lost the term; stand again
        finally:
            # The library cancels a term only when renewal fails; on our own stop we do.
            running: list[asyncio.Future[Any]] = [t for t in terms if not t.done()]
            if election is not None and not election.done():
                running.append(election)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await asyncio.shield(self._hand_back())

    async def _hand_back(self) -> None:
        """Clear the holder if it is us, guarded by resourceVersion (never clear another's)."""
        api = k8s.CoordinationV1Api(self.api_client)
        s = self.settings
        try:
            async with asyncio.timeout(2.0):
                lease = await api.read_namespaced_lease(s.name, s.namespace)
                if lease.spec is None or lease.spec.holder_identity != self.identity:
                    return
                lease.spec = k8s.V1LeaseSpec(
                    lease_duration_seconds=lease.spec.lease_duration_seconds
                )
                await api.replace_namespaced_lease(s.name, s.namespace, lease)
                log.info("lease handed back", identity=self.identity)
        except (ApiException, TimeoutError, OSError) as exc:
            log.info("lease not handed back; it expires on its own", error=str(exc))
