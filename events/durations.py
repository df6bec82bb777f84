"""Durations as people write them: ``30s``, ``5m``, ``1h``, ``1h30m``, ``250ms`` or plain seconds.

One parser for the command line's flags and the resources' fields (a pool's ``maxAge: 6h``), so a
duration means the same wherever it is written. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
EXAMPLES = "e.g. 30s, 5m, 1h, 1h30m or 250ms"
_SHOWN = 40
"""At most this much of a bad value is quoted back: a megabyte of input is not echoed."""


def parse_duration(text: str | float) -> float:
    """Seconds in ``text``; raises ValueError with the accepted forms named."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration; use {EXAMPLES}")
    if isinstance(text, int | float):
        try:
            seconds = float(text)
        except OverflowError:  # an int past any float: no duration either
            raise ValueError(f"a number that large is not a duration; use {EXAMPLES}") from None
    else:
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
                raise ValueError(f"{_shown(text)} is not a duration; use {EXAMPLES}") from None
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"{_shown(text)} is not a duration; use {EXAMPLES}")
    return seconds


def _shown(value: str | float) -> str:
    if isinstance(value, str) and len(value) > _SHOWN:
        return f"{value[:_SHOWN]!r}... ({len(value)} characters)"
    return repr(value)


def format_duration(seconds: float) -> str:
    """``seconds`` as ``parse_duration`` reads it back, to the same float: whole hours or minutes
    in those units, else seconds with every digit they need and no exponent."""
    if seconds and seconds % 3600 == 0:
        return f"{_digits(seconds / 3600)}h"
    if seconds and seconds % 60 == 0:
        return f"{_digits(seconds / 60)}m"
    return f"{_digits(seconds)}s"


def _digits(number: float) -> str:
    """The shortest decimal that is ``number`` (``repr``), written out: ``%g`` keeps only six
    digits (31535999 became ``3.1536e+07``) and writes exponents no parser here reads."""
    text = format(Decimal(repr(float(number) + 0.0)), "f")  # + 0.0: no "-0"
    return text.removesuffix(".0") if "." in text else text
