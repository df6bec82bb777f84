"""Which provider names the running system has, as far as the log can tell: for ``apply`` to
refuse a proxy no executor could ever create (docs/decisions/0098-commands-tell-the-truth-exit.md).

No service records its providers config. The nearest record is the GC's: every sweep appends one
``SweepCompleted`` per configured provider on ``gc.<provider>``, all with the sweep's id (even a
provider whose listing failed), and a GC runs beside every executor with the same providers config
(``up`` runs both from its flags, a cluster mounts one ConfigMap in both). The providers of the
newest sweep are the names the system had then. A sweep appends provider after provider once it
has listed them all, so a read between two of those appends sees only some: ``apply`` reads again
after ``SETTLE_SECONDS`` before it refuses. Without a sweep in the log (no GC ran, the stream is
missing or unreadable) it cannot know, and says so by answering None.
"""

from __future__ import annotations

from dataclasses import dataclass

import nats.errors
import structlog
from nats.js.client import JetStreamContext

from events import codec
from events.schemas import SweepCompleted
from events.subjects import GC_STREAM

log = structlog.get_logger("egress.cli")

SETTLE_SECONDS = 1.0
"""Far longer than a sweep takes to append its summaries (one append per provider, back to back),
and short enough for a refusal to come at once to a person at a terminal."""

MAX_PROVIDERS = 256
"""More ``gc.*`` subjects than this, and the check is not made: each costs one read, and no
install has this many providers (nor a stream that held them would be the GC's)."""


@dataclass(frozen=True, slots=True)
class KnownProviders:
    names: frozenset[str]
    sweep_id: str
    """The sweep whose providers these are: its id starts with when it ran."""


async def known_providers(js: JetStreamContext) -> KnownProviders | None:
    """The provider names of the newest GC sweep in the log; None when it cannot tell."""
    try:
        info = await js.stream_info(GC_STREAM, subjects_filter="gc.*")
        listed = sorted((info.state.subjects or {}).keys())
        if not listed or len(listed) > MAX_PROVIDERS:
            return None
        lasts = [await js.get_last_msg(GC_STREAM, subject) for subject in listed]
    except (nats.errors.Error, TimeoutError) as exc:
        # Not knowing is an answer here: apply goes on as it did before this check.
        log.debug("cannot read the GC sweeps", error=f"{type(exc).__name__}: {exc}")
        return None
    sweeps: list[tuple[int, str, str]] = []  # (sequence, sweep id, provider)
    for raw in lasts:
        try:
            event = codec.decode(raw.data or b"", raw.headers)
        except codec.CodecError:
            continue
        if isinstance(event, SweepCompleted) and event.sweep_id and raw.seq is not None:
            sweeps.append((raw.seq, event.sweep_id, event.provider))
    if not sweeps:
        return None
    newest = max(sweeps)[1]
    return KnownProviders(frozenset(p for _, s, p in sweeps if s == newest), newest)
