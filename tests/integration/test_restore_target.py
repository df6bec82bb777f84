"""What a restore finds on the server before it replaces anything: a health replica still
registered means services run against it; one that stopped cleanly (its key deleted, a delete
marker left in the bucket) does not."""

from __future__ import annotations

import pytest

from services.cli.backup.streamio import inspect
from services.health.assign import Membership
from services.runtime.nats.connection import Connection

pytestmark = pytest.mark.integration


async def test_a_replica_registered_is_busy_and_one_that_left_is_not(conn: Connection) -> None:
    assert "health replicas are registered" not in (await inspect(conn.nc)).busy
    member = Membership(conn.js, "health-1", heartbeat=30.0)
    await member.join()
    assert "health replicas are registered" in (await inspect(conn.nc)).busy
    await member.leave()
    target = await inspect(conn.nc)
    assert "health replicas are registered" not in target.busy
    assert int(target.streams["KV_egress-health-members"]["state"]["messages"]) >= 1  # the marker
