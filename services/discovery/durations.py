"""Durations on the command line: ``30s``, ``5m``, ``1h``, ``1h30m``, ``250ms`` or plain seconds."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import click

from services.runtime.errors import ConfigError

DurationCallback = Callable[[click.Context, click.Parameter, object], float]
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
EXAMPLES = "e.g. 30s, 5m, 1h, 1h30m or 250ms"


def parse_duration(text: str) -> float:
    """Seconds in ``text``; raises ValueError with the accepted forms named."""
    value = text.strip().lower()
    if not value:
        raise ValueError(f"an empty duration; use {EXAMPLES}")
    try:
        seconds = float(value)
    except ValueError:
        pos = 0
        seconds = 0.0
        for match in _PART.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(value) or pos == 0:
            raise ValueError(f"{text!r} is not a duration; use {EXAMPLES}") from None
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a duration; use {EXAMPLES}")
    return seconds


def seconds_of(
    flag: str, value: float | str, *, positive: bool = False, maximum: float | None = None
) -> float:
    """A flag's value in seconds, from a number or a duration text; the error names the flag."""
    try:
        seconds = parse_duration(value) if isinstance(value, str) else float(value)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    if not math.isfinite(seconds):
        raise ConfigError(f"{flag}: {value!r} is not a duration; use {EXAMPLES}")
    if seconds < 0 or (positive and seconds == 0):
        need = "more than 0" if positive else "0 or more"
        raise ConfigError(f"{flag}: {value!r} must be {need}; use {EXAMPLES}")
    if maximum is not None and seconds > maximum:
        raise ConfigError(f"{flag}: {too_long(value, maximum)}")
    return seconds


def too_long(value: object, maximum: float) -> str:
    return f"{value!r} is longer than the most allowed, {format_duration(maximum)}"


def format_duration(seconds: float) -> str:
    if seconds and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def duration_option(*, positive: bool = False, maximum: float | None = None) -> DurationCallback:
    """A click ``callback`` that reads a duration into seconds; click's error names the flag
    (``Invalid value for '--max-lease-ttl': ...``) and the variable it came from."""

    def convert(ctx: click.Context, param: click.Parameter, value: object) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(str(value))
            except ValueError as exc:
                raise click.BadParameter(str(exc), ctx, param) from None
        if not math.isfinite(seconds) or seconds < 0:
            raise click.BadParameter(f"{value!r} is not a duration; use {EXAMPLES}", ctx, param)
        if positive and seconds == 0:
            raise click.BadParameter(f"{value!r} must be more than 0; use {EXAMPLES}", ctx, param)
        if maximum is not None and seconds > maximum:
            raise click.BadParameter(too_long(value, maximum), ctx, param)
        return seconds

    return convert
