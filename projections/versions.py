"""The snapshot version of each fold whose views are stored as snapshots.

A snapshot holds a view as a fold made it; restored by a build whose fold differs, it would be
a view no fold of this build makes. So every change to a fold's view (its fields, or what the
fold puts in them) takes a new number here: the new build ignores the old snapshots (their keys
name the old version) and rebuilds from the events. ``tests/unit/test_snapshot_versions.py``
fails when a view's schema changes while its number does not.
"""

from __future__ import annotations

PROXY = 6
"""``projections.proxy.ProxyView``. Its rotation structs (``projections.rotation``) are in the
reconciler's state too: a change to them takes a new number here and in
``services.reconciler.pure.view.VERSION``."""
LEASE = 5
"""``projections.lease.LeaseView``."""
POOL = 1
"""``projections.pool.PoolView``: stored only in time-travel checkpoints."""
METER = 1
"""``projections.meter.MeterView``."""
