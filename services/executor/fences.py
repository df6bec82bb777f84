"""The fence floor of a proxy's next instance: its highest granted fencing token.

A proxy's instances keep their fencing state to themselves (the helper's state file, D84), so an
instance that replaces a crashed or deleted one would start knowing no token, and a holder fenced
on the old one would be served again until the current holder's next request. The executor
therefore hands every create the token the lease fold (``projections.lease``) gives the proxy,
and the new instance refuses every lease below it from its first request (docs/decisions/,
D92).

The token is the fold's, not a guess from the subject's last sequence: only a granted claim or a
switch sets it, and a floor above the current holder's token would lock the holder out. Reading
``lease.<uid>`` is a read of one literal subject (docs/architecture.md, "Reads"), and each view
is kept, with the sequence it was read to, so the next create of the same proxy (a crash loop
re-creates one instance after another) reads only the events since.
"""

from __future__ import annotations

from collections import OrderedDict

from events import subjects
from events.store import EventStore
from projections.lease import LeaseView, fold

KEEP = 1024
"""Views kept between creates: the proxies re-created most recently."""


class FenceFloors:
    """``floor(uid)``: the highest fencing token granted on the proxy, as of now."""

    def __init__(self, store: EventStore, *, keep: int = KEEP) -> None:
        if keep < 0:
            raise ValueError(f"keep={keep}: give a number of views >= 0")
        self.store = store
        self.keep = keep
        self._views: OrderedDict[str, tuple[LeaseView | None, int]] = OrderedDict()

    async def floor(self, proxy_uid: str) -> int:
        view, read_to = self._views.get(proxy_uid, (None, 0))
        history = await self.store.read(subjects.lease(proxy_uid), after_seq=read_to)
        view = fold(history.events, view)
        kept = self._views.get(proxy_uid)
        # Two creates of one proxy may read at once: keep the view read further.
        if self.keep and (kept is None or kept[1] <= history.last_seq):
            self._views[proxy_uid] = (view, history.last_seq)
            self._views.move_to_end(proxy_uid)
            while len(self._views) > self.keep:
                self._views.popitem(last=False)
        return view.fencing_token if view is not None else 0
