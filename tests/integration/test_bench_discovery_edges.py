"""D139's benchmark does the work it reports: its views hold the active leases it divides by,
none of them due (the steady state it claims to measure), and a leased member deleted in them
is found due, so the revocation scan it times is the one that ends leases. Timings are never
asserted."""

from __future__ import annotations

import msgspec
import pytest

from bench import discovery_edges as bench
from services.discovery.http import models
from services.discovery.leasing.revocation import due

pytestmark = pytest.mark.integration


def test_the_fleet_is_leased_and_none_is_due_until_a_member_is_deleted() -> None:
    views = bench.fleet(50)
    assert len(views.active_leases()) == 50
    assert due(views) == []
    deleted = msgspec.structs.replace(views.proxies.views["p7"], deleting=True)
    views.proxies.views["p7"] = deleted
    assert [(v.proxy_uid, why) for v, why in due(views)] == [("p7", "proxy_deleted")]


def test_the_figures_cover_what_was_asked_and_restore_the_check() -> None:
    check = models._target
    got = bench.measure(leases=30, decodes=20, rounds=1)
    assert (got.leases, got.decodes, got.rounds, got.due) == (30, 20, 1, 0)
    assert got.scan_before_ns > 0
    assert got.scan_after_ns > 0
    assert models._target is check
    with pytest.raises(msgspec.ValidationError, match="target: "):
        msgspec.json.decode(b'{"outcome": "failed", "target": "a<b"}', type=models.ReportRequest)
