"""One stored message as the CLI shows it: pure, so the renderers stay free of the NATS reader."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from events.schemas import AnyEvent

UNKNOWN_TYPE = "?"


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One stored message as shown: the decoded event, or why it could not be decoded."""

    seq: int
    time: datetime
    subject: str
    type: str
    event: AnyEvent | None
    error: str = ""
    payload: bytes = b""
    skipped: str = ""
    """Why every reader skips this event (``events.skips``: undecodable, unknown_type,
    unusable); "" for an event the folds use."""
