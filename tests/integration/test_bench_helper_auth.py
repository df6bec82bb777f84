"""bench.helper_auth runs the real helper at a tiny size and reports a figure for every kind of
check, each from checks the helper answered as the kind says (a current lease and the probe OK,
a forged password ERR). No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import helper_auth
from services.providers.squidauth import helper

pytestmark = pytest.mark.integration


def test_the_benchmark_measures_what_it_names() -> None:
    # The helper of today as the "baseline" too: it must refuse the scheme before D133.
    figures = helper_auth.run(checks=96, rounds=1, window=8, baseline=Path(helper.__file__))
    by = {(f.helper, f.kind): f for f in figures}
    assert set(by) == {(h, k) for h in ("new", "baseline") for k in helper_auth.KINDS}
    for kind, verdict in helper_auth.EXPECTED.items():
        assert by["new", kind].answers == {verdict: 96}
        assert by["baseline", kind].answers == {"ERR": 96}  # a lease id is no login any more
    assert all(f.cpu_us >= 0 and f.wall_us > 0 for f in figures)
    assert "| new | forged | 96 |" in helper_auth.render(figures)
