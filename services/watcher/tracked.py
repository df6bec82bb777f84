"""The watcher's fold of the ``PROXY`` stream: the proxy view plus what only declarations say.

Pure. The status writer needs the view (phase, IP, conditions); the watcher's re-list needs to
know which proxies *Kubernetes* declared (a proxy declared by the CLI is not deleted because no
custom resource lists it) and with which cloud-init (a rotated Secret is a change).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from events.schemas import ProxyDeclared, ProxySpecChanged
from events.store import Recorded
from projections.proxy import ProxyView
from projections.proxy import apply as apply_view
from services.watcher.objects import SOURCE


class Tracked(msgspec.Struct, frozen=True, kw_only=True):
    view: ProxyView
    source: str = ""
    cloud_init: str = ""

    @property
    def live(self) -> bool:
        return not self.view.removed and not self.view.deleting


def apply(current: Tracked | None, recorded: Recorded) -> Tracked:
    view = apply_view(current.view if current is not None else None, recorded)
    source = current.source if current is not None else ""
    cloud_init = current.cloud_init if current is not None else ""
    match recorded.event:
        case ProxyDeclared(source=declared_by, cloud_init_resolved=ci):
            source, cloud_init = declared_by, ci
        case ProxySpecChanged(cloud_init_resolved=ci):
            cloud_init = ci
    return Tracked(view=view, source=source, cloud_init=cloud_init)


def vanished(listed: Iterable[str], tracked: Mapping[str, Tracked]) -> list[str]:
    """Proxies Kubernetes declared, still live in the log, whose object the listing lacks: they
    were deleted while no watcher ran (or their finalizer was removed by hand)."""
    present = set(listed)
    return sorted(
        uid for uid, t in tracked.items() if t.source == SOURCE and t.live and uid not in present
    )
