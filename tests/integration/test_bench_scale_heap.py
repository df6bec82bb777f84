"""The heap benchmark takes its snapshot from the discovery it started, once caught up: the
snapshot holds the bytes of that process's Python allocations, attributed to lines and files, and
the traced total is within the process's resident memory.

Sizes are never asserted beyond that (they depend on the fleet and the interpreter).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import scale_heap

pytestmark = pytest.mark.integration


async def test_a_tiny_run_reports_where_discovery_s_bytes_are(tmp_path: Path) -> None:
    heap = await scale_heap.measure(tmp_path, proxies=30, n=5, timeout=180.0)

    assert heap.caught_up_s > 0
    assert 0 < heap.traced_mb <= heap.rss_mb
    assert len(heap.lines) == 5
    assert len(heap.files) == 5
    assert all(":" in line.where and line.mb >= 0 and line.blocks > 0 for line in heap.lines)
    assert heap.lines[0].mb >= heap.lines[-1].mb  # largest first
    assert sum(f.mb for f in heap.files) <= heap.traced_mb + 0.1  # each rounded
    text = scale_heap.render(heap)
    assert "30 proxies" in text
    assert heap.lines[0].where in text
