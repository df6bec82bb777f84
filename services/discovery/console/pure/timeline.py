"""A proxy's timeline: each stored event of its PROXY and LEASE subjects as one line.

Pure: from a ``Recorded`` (and what reading it found: a skip reason, a trace id) to a ``Line``
with the time, the type, a one-line summary and the trace id. The text is shown as it is
stored; the templates escape it (docs/console.md, "Untrusted text").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from events import codec
from events.egress import EgressChanged, EgressObserved
from events.schemas import (
    CreateInstance,
    DeleteInstance,
    HealthChanged,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    LeaseRenewed,
    LeaseReported,
    LeaseSwitched,
    ObserveInstance,
    PhaseChanged,
    ProviderFailed,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpecChanged,
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from events.store import Recorded, Unreadable

MAX_SUMMARY = 240
MAX_LINES = 500
"""The newest lines a proxy page shows; it says how many older ones it left out."""


@dataclass(frozen=True, slots=True)
class Line:
    seq: int
    stream: str
    time: datetime
    type: str
    kind: str
    """The subject's category (declared, cmd, instance, health, status, lease), or skipped."""
    summary: str
    trace_id: str = ""
    causation_id: str = ""


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_SUMMARY else text[: MAX_SUMMARY - 1] + "…"


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value >= 1 else f"{value:.2f} ms"


def _attrs(attributes: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(attributes.items())) or "no attributes"


def _place(e: EgressObserved) -> str:
    parts = [
        e.country,
        f"AS{e.asn}" if e.asn else "",
        e.org,
        "private" if e.scope == "private" else "",
    ]
    return (" (" + ", ".join(p for p in parts if p) + ")") if any(parts) else ""


def summary(event: object) -> str:
    """One line that tells this event from the others of its type."""
    match event:
        case ProxyDeclared() as e:
            return (
                f"declared {e.namespace}/{e.name} on {e.spec.provider or '?'} "
                f"({_attrs(e.spec.attributes)}), generation {e.generation}, by {e.source}"
            )
        case ProxySpecChanged() as e:
            return f"spec changed ({_attrs(e.spec.attributes)}), generation {e.generation}"
        case ProxyDeletionRequested():
            return "deletion requested"
        case ProxyRemoved():
            return "removed"
        case CreateInstance() as e:
            return f"command: create {e.instance_name} on {e.provider}"
        case ObserveInstance() as e:
            return f"command: observe {e.provider_id} on {e.provider}"
        case DeleteInstance() as e:
            return f"command: delete {e.provider_id} on {e.provider}"
        case InstanceCreated() as e:
            return f"instance {e.provider_id} created"
        case InstanceObserved() as e:
            return f"instance {e.provider_id} {e.state}" + (f", IP {e.ip}" if e.ip else "")
        case InstanceGone() as e:
            return f"instance {e.provider_id} gone"
        case ProviderFailed() as e:
            return f"{e.operation} failed ({e.error_class}): {e.message}"
        case HealthChanged() as e:
            word = "healthy" if e.healthy else "unhealthy"
            about = f" ({e.provider_id})" if e.provider_id else ""
            detail = f", {_ms(e.latency_ms)}" if e.latency_ms else ""
            return f"{word}{about}{detail}" + (f": {e.message}" if e.message else "")
        case EgressChanged() as e:
            return f"egress changed from {e.old_ip or '?'} to {e.ip}{_place(e)}"
        case EgressObserved() as e:
            about = f" ({e.provider_id})" if e.provider_id else ""
            if e.error and not e.ip:
                return f"egress check failed{about}: {e.error}"
            return f"egress {e.ip}{_place(e)}{about}" + (f": {e.error}" if e.error else "")
        case PhaseChanged() as e:
            text = f"phase {e.phase}" + (f" ({e.reason})" if e.reason else "")
            text += f", IP {e.ip}" if e.ip else ""
            return text + (f": {e.message}" if e.message else "")
        case LeaseAcquired() as e:
            holder = e.holder or "an anonymous holder"
            return f"lease {e.lease_id} claimed by {holder} for {e.ttl_seconds:g} s"
        case LeaseRenewed() as e:
            return f"lease {e.lease_id} renewed for {e.ttl_seconds:g} s"
        case LeaseReleased() as e:
            how = "withdrawn" if e.withdrawn else f"ended ({e.reason})" if e.reason else "released"
            return f"lease {e.lease_id} {how}, cooldown {e.cooldown_seconds:g} s"
        case LeaseExpired() as e:
            return f"lease {e.lease_id} expired"
        case LeaseReported() as e:
            target = f" for {e.target}" if e.target else ""
            return f"report {e.outcome}{target}" + (f": {e.detail}" if e.detail else "")
        case LeaseSwitched() as e:
            return f"lease {e.lease_id} switched to {e.provider_id} (rotation {e.rotation_id})"
        case RotationRequested() as e:
            return f"rotation {e.rotation_id} requested" + (
                f" by lease {e.lease_id}" if e.lease_id else ""
            )
        case ReplacementStarted() as e:
            return f"rotation {e.rotation_id}: replacement started ({e.reason})"
        case ReplacementPromoted() as e:
            return f"rotation {e.rotation_id}: {e.provider_id} took over"
        case RotationEnded() as e:
            return f"rotation {e.rotation_id} {e.outcome}" + (f": {e.message}" if e.message else "")
        case Unreadable() as e:
            return f"skipped ({e.reason}): {e.type}" + (f": {e.detail}" if e.detail else "")
    return ""


def line(recorded: Recorded, stream: str, trace_id: str = "") -> Line:
    event = recorded.event
    if isinstance(event, Unreadable):
        kind, kind_type = "skipped", event.type or "?"
    else:
        kind, kind_type = event.category, codec.event_type(event)
    return Line(
        seq=recorded.seq,
        stream=stream,
        time=recorded.timestamp,
        type=kind_type,
        kind=kind,
        summary=_cut(summary(event)),
        trace_id=trace_id,
        causation_id=recorded.causation_id,
    )


def merged(lines: list[Line], limit: int = MAX_LINES) -> tuple[list[Line], int]:
    """Both streams' lines by time (then stream and sequence), newest first, at most
    ``limit``; and how many older ones were left out."""
    ordered = sorted(lines, key=lambda ln: (ln.time, ln.stream, ln.seq), reverse=True)
    return ordered[:limit], max(len(ordered) - limit, 0)
