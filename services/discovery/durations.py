"""Durations on the command line: ``30s``, ``5m``, ``1h``, ``1h30m``, ``250ms`` or plain seconds."""

from __future__ import annotations

import math
from collections.abc import Callable

import click

from events.durations import EXAMPLES, format_duration, parse_duration
from services.runtime.errors import ConfigError

__all__ = ["EXAMPLES", "duration_option", "format_duration", "parse_duration", "seconds_of"]

DurationCallback = Callable[[click.Context, click.Parameter, object], float]


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
