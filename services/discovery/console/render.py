"""The console's HTML: Jinja2 templates with autoescaping on for every template.

Everything the pages show that the system did not write itself (names, attributes, holders,
messages, report details, trace ids: all from the log, where any writer with the rights may put
any text) is escaped by the engine, in text and in attributes alike; no template marks a value
safe. The pages load no script but ``static/console.js`` and are served with a
Content-Security-Policy that allows nothing else (``routes.SECURITY_HEADERS``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined

from services.discovery.console.pure.pools import age
from services.discovery.console.pure.traffic import human_bytes

TIME = "%Y-%m-%d %H:%M:%S"
INPUT_TIME = "%Y-%m-%dT%H:%M:%S"


def when(value: datetime | None, precise: bool = False) -> str:
    if value is None:
        return "-"
    text = value.strftime(TIME)
    return f"{text}.{value.microsecond // 1000:03d}" if precise else text


def local_input(value: datetime | None) -> str:
    """The time control's value: ISO 8601 in UTC, as every time on the page is. A
    ``datetime-local`` input would show the browser's locale (a US date, AM/PM) on a UTC page."""
    return value.strftime(INPUT_TIME) if value is not None else ""


def until(value: datetime | None, now: datetime) -> str:
    """How far ``value`` is from ``now``, in the largest unit: ``in 4m``, ``12s ago``."""
    if value is None:
        return "-"
    seconds = int((value - now).total_seconds())
    size = abs(seconds)
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if size >= span:
            amount = f"{size // span}{unit}"
            break
    else:
        amount = f"{size}s"
    return f"in {amount}" if seconds >= 0 else f"{amount} ago"


def iso(value: datetime | None) -> str:
    """A time for the script (``data-at``), which rewrites "in 4m" as the page stays open."""
    return value.isoformat() if value is not None else ""


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def query(pairs: Iterable[tuple[str, str]]) -> str:
    """``?a=1&b=2`` for the non-empty pairs; "" for none."""
    kept = [(k, v) for k, v in pairs if v]
    return "?" + urlencode(kept) if kept else ""


def pool_path(namespace: str, name: str) -> str:
    """A pool page's path, each part quoted whole (a ``/`` too: only a hand-written log holds
    one, and it must not make another path)."""
    return f"/ui/pools/{quote(namespace, safe='')}/{quote(name, safe='')}"


def pool_href(ref: str) -> str:
    """The page of the pool ``namespace/name`` a fleet row names."""
    namespace, _, name = ref.partition("/")
    return pool_path(namespace, name)


ENV = Environment(
    loader=PackageLoader("services.discovery.console", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters.update(
    when=when,
    local_input=local_input,
    until=until,
    iso=iso,
    ms=ms,
    pool_href=pool_href,
    age=age,
    bytes=human_bytes,
)
ENV.globals.update(query=query, pool_path=pool_path)


def page(template: str, **context: Any) -> str:
    return ENV.get_template(template).render(**context)
