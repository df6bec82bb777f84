"""What the observe sweep records about a Ready proxy's instance, given the provider's answer.

Facts, not polls: an answer equal to the last recorded fact records nothing, so a fleet of
healthy proxies costs provider calls but no events (``services.executor.observe`` asks).
"""

from __future__ import annotations

from events.schemas import Event, InstanceGone, InstanceState, Phase
from projections.proxy import GONE, ProxyView
from services.executor.pure.answers import observed
from services.providers.base import Instance


def known_state(view: ProxyView) -> str:
    """The last fact about the *current* instance (an ``InstanceState`` or ``GONE``); "" when
    none was recorded, or only its creation."""
    fact = view.instance
    return fact.state if fact is not None and fact.provider_id == view.provider_id else ""


def watched(view: ProxyView) -> bool:
    """Ready instances only: anything else is in the reconciler's hands already."""
    return (
        view.phase is Phase.READY
        and bool(view.provider_id)
        and not view.deleting
        and not view.removed
    )


def observation(view: ProxyView, instance: Instance | None) -> Event | None:
    """What to record for the provider's answer (None: NotFound), or None if nothing changed."""
    known = known_state(view)
    last_ip = view.instance.ip if view.instance is not None else ""
    command_id = f"observe-{view.last_seq}"
    if instance is None:
        if known == GONE:
            return None
        return InstanceGone(
            command_id=command_id, provider=view.spec.provider, provider_id=view.provider_id
        )
    if instance.state is InstanceState.RUNNING:
        # Ready means the reconciler saw it running; only a new address is news.
        ip_changed = bool(last_ip) and bool(instance.ip) and instance.ip != last_ip
        if known in ("", InstanceState.RUNNING) and not ip_changed:
            return None
    elif str(instance.state) == known:
        return None
    return observed(command_id, view.spec.provider, instance)
