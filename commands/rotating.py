"""Asking for a fresh instance of a Proxy: shared by the pool controller (an aged or blocked
member) and the Kubernetes watcher (a member whose mirror was deleted by hand).

The request is decided on the folded aggregate with optimistic concurrency, as
``commands.declaring`` does: a Proxy going away, or with a rotation under way, gets none, so
two writers asking at once record one. The rotation's id derives from the cause and the
sequence folded, so a retried append is stored once.
"""

from __future__ import annotations

from typing import Literal

from events import subjects
from events.errors import ConcurrencyError
from events.schemas import RotationRequested
from events.store import EventStore, History, NewEvent, decide_and_append, derive_msg_id
from projections.proxy import fold

Requested = Literal["requested", "absent", "rotating", "contended"]
"""``absent``: removed or being deleted; ``rotating``: a rotation is under way already;
``contended``: the Proxy kept changing under every attempt (the caller may log it)."""

ATTEMPTS = 20


async def request_rotation(
    store: EventStore, uid: str, *, cause: str, client: str, reason: str = ""
) -> Requested:
    """Append ``RotationRequested`` for the Proxy ``uid``, unless it is going or rotating.
    ``cause`` names why (it seeds the rotation's id); ``client`` is who asks; ``reason`` is
    recorded on the request (``EgressMismatch``: the system's own, and bounded)."""
    results: list[Requested] = []

    def decide(history: History) -> list[NewEvent]:
        proxy = fold(list(history.events))
        results.clear()
        if proxy is None or proxy.removed or proxy.deleting:
            results.append("absent")
            return []
        if proxy.rotation is not None and proxy.rotation.in_progress:
            results.append("rotating")
            return []
        results.append("requested")
        rotation_id = "rot-" + derive_msg_id(cause, uid, str(history.last_seq))[:20]
        event = RotationRequested(uid=uid, rotation_id=rotation_id, client=client, reason=reason)
        return [NewEvent(event, derive_msg_id("rotation-requested", rotation_id))]

    try:
        await decide_and_append(store, subjects.proxy(uid), decide, max_attempts=ATTEMPTS)
    except ConcurrencyError:
        return "contended"
    return results[-1]
