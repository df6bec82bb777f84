"""A view whose schema changes must take a new snapshot version (``projections.versions``):
otherwise a new build would restore snapshots an older fold wrote, in a shape it does not make.

When this fails: bump the fold's number in ``projections/versions.py`` and write the new
version and schema hash into ``RECORDED`` below. A change of what a fold *puts* into an
unchanged schema needs a bump too; no test can see that one, so the reviewer has to."""

from __future__ import annotations

import hashlib
import json

import msgspec
import pytest

from projections import versions
from projections.lease import LeaseView
from projections.meter import MeterView
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.reconciler.pure import view

RECORDED = {
    "ProxyView": (6, "f59df582c346b19e"),
    "LeaseView": (5, "6966bbcb7a3f77f8"),
    "PoolView": (1, "8f17628cb7959200"),
    "MeterView": (1, "0be741cd174a150b"),
    "ProxyState": (5, "a6f858d1bfbd678a"),
}
CURRENT = {
    "ProxyView": (versions.PROXY, ProxyView),
    "LeaseView": (versions.LEASE, LeaseView),
    "PoolView": (versions.POOL, PoolView),
    "MeterView": (versions.METER, MeterView),
    "ProxyState": (view.VERSION, view.ProxyState),
}


def schema_hash(view: type) -> str:
    schema = json.dumps(msgspec.json.schema(view), sort_keys=True)
    return hashlib.sha256(schema.encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(CURRENT))
def test_a_changed_view_has_a_new_snapshot_version(name: str) -> None:
    version, view = CURRENT[name]
    recorded_version, recorded_hash = RECORDED[name]
    if schema_hash(view) != recorded_hash:
        assert version > recorded_version, (
            f"{name} changed shape: bump its number in projections/versions.py, then record "
            f"({version + 1}, {schema_hash(view)!r}) here"
        )
        pytest.fail(f"record {name}'s new schema: ({version}, {schema_hash(view)!r})")
    assert version == recorded_version, f"record {name}'s version {version} here"
