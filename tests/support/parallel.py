"""A pytest plugin: how `make test` spreads the suite over xdist's workers
(docs/decisions/0145-parallel-tests.md); tests/conftest.py loads it.

With ``--dist loadgroup``, every test may run on any worker but the groups of
``markers.SHARED_FILES`` (the kvm tests), each of which runs on one worker, the largest handed out
first. xdist's own loadgroup reads ``xdist_group`` marks through a suffix it writes into the node
id, which pytest 9.2 no longer lets it change (pytest-xdist issue 1386): every mark is then
ignored without a word. This scheduler finds the group from the node id as it is, so it does not
depend on that.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]  # no type info

from tests.support import markers


class SharedOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]  # its base is untyped
    """xdist's scheduling by scope (a unit of work is handed to one worker, the largest first),
    with a scope per test but for the groups of ``markers.SHARED_FILES``."""

    def _split_scope(self, nodeid: str) -> str:
        return markers.shared_group(nodeid) or nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Ours for ``--dist loadgroup``; xdist's own for any other ``--dist``. Optional: a run with
    ``-p no:xdist`` has no such hook."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return SharedOnOneWorker(config, log)
