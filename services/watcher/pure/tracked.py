"""Which proxies in the log the watcher answers for, read from the shared proxy view.

Pure. The watcher's re-list must know which proxies *Kubernetes* declared (``ProxyView.source``):
a proxy declared by the CLI is not deleted because no custom resource lists it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from projections.proxy import ProxyView
from services.watcher.pure.objects import SOURCE


def live(view: ProxyView) -> bool:
    return not view.removed and not view.deleting


def vanished(listed: Iterable[str], views: Mapping[str, ProxyView]) -> list[str]:
    """Proxies Kubernetes declared, still live in the log, whose object the listing lacks: they
    were deleted while no watcher ran (or their finalizer was removed by hand)."""
    present = set(listed)
    return sorted(
        uid for uid, v in views.items() if v.source == SOURCE and live(v) and uid not in present
    )
