"""Durations on the command line: ``30s``, ``5m``, ``1h``, ``1h30m``, ``250ms`` or plain seconds."""

from __future__ import annotations

import math

from events.durations import EXAMPLES, format_duration, parse_duration
from services.runtime.settings.errors import ConfigError

__all__ = ["EXAMPLES", "duration_seconds", "format_duration", "parse_duration", "seconds_of"]


def seconds_of(
    flag: str, value: float | str, *, positive: bool = False, maximum: float | None = None
) -> float:
    """A flag's value in seconds, from a number or a duration text; the error names the flag."""
    try:
        return duration_seconds(value, positive=positive, maximum=maximum)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def duration_seconds(
    value: float | str, *, positive: bool = False, maximum: float | None = None
) -> float:
    """``value`` in seconds, within the bounds; a ``ValueError`` says what is wrong with it, for
    the caller to name where it came from (a flag here, click's option in the CLI)."""
    seconds = parse_duration(value) if isinstance(value, str) else float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a duration; use {EXAMPLES}")
    if seconds < 0 or (positive and seconds == 0):
        need = "more than 0" if positive else "0 or more"
        raise ValueError(f"{value!r} must be {need}; use {EXAMPLES}")
    if maximum is not None and seconds > maximum:
        raise ValueError(too_long(value, maximum))
    return seconds


def too_long(value: object, maximum: float) -> str:
    return f"{value!r} is longer than the most allowed, {format_duration(maximum)}"
