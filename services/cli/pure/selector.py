"""``get -l KEY=VALUE[,KEY=VALUE]``: proxies chosen by their attributes, as a lease selector
chooses them (every pair must match exactly)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MAX_PAIRS = 32


def parse_selector(values: Iterable[str]) -> dict[str, str]:
    """Every ``-l`` given, each a comma-separated list of pairs; a key given twice with two
    values could match nothing, so it is refused rather than silently narrowed."""
    out: dict[str, str] = {}
    for text in values:
        for pair in text.split(","):
            key, sep, value = pair.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise ValueError(f"{pair!r}: write KEY=VALUE, e.g. pool=de or country=de,pool=de")
            if out.get(key, value) != value:
                raise ValueError(f"{key} is given twice ({out[key]!r} and {value!r}); keep one")
            out[key] = value
    if len(out) > MAX_PAIRS:
        raise ValueError(f"at most {MAX_PAIRS} KEY=VALUE pairs")
    return out


def matches(attributes: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(attributes.get(key) == value for key, value in selector.items())
