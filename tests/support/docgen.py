"""The lists in the docs that the code already holds, generated from it so that they cannot
drift: the event types (docs/architecture.md, "Event types", from the union in events/), the
exported metrics (docs/operations.md, "Metrics", from every metric set the services register)
and each service's flags and variables (docs/operations.md, "Service settings", from the
settings Structs, D148).

``python -m tests.support.docgen`` rewrites each generated block in place, between its marker
comments; tests/unit/test_docs_generated.py fails while one is stale, as
tests/unit/test_decisions.py does for the decisions index (tests/support/decisions.py).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import msgspec
import msgspec.inspect as mi
from prometheus_client import CollectorRegistry

from events import subjects
from events.durations import format_duration
from events.schemas import (
    EVENT_TYPES,
    DeadLettered,
    DemandEvent,
    GcEvent,
    LeaseEvent,
    MeterEvent,
    PoolEvent,
    ProxyEvent,
    TrafficEvent,
)
from services.cli.run.registry import SERVICES
from services.runtime.observability.metrics import metric_set
from services.runtime.settings.spec import SettingField, setting_fields

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
OPERATIONS = ROOT / "docs" / "operations.md"

# The suffixes a scrape shows for each kind of metric family (what a query names).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


def begin(name: str) -> str:
    return f"<!-- generated: {name} (python -m tests.support.docgen); do not edit by hand -->"


def end(name: str) -> str:
    return f"<!-- end generated: {name} -->"


# --------------------------------------------------------------------------------------------
# Event types


@dataclass(frozen=True, slots=True)
class Family:
    """One stream's part of the union, and the subject its events are written to."""

    stream: str
    members: tuple[type, ...]
    subject: str


def families() -> list[Family]:
    """Every part of ``AnyEvent`` with its stream; a type added to the union and to none of
    these parts raises, naming it, so the table cannot leave it out."""
    found = [
        Family(subjects.PROXY_STREAM, get_args(ProxyEvent), "proxy.<uid>.{category}"),
        Family(subjects.LEASE_STREAM, get_args(LeaseEvent), "lease.<proxy uid>"),
        Family(subjects.GC_STREAM, get_args(GcEvent), "gc.<provider>"),
        Family(subjects.POOL_STREAM, get_args(PoolEvent), "pool.<uid>.{category}"),
        Family(subjects.DEMAND_STREAM, (DemandEvent,), "demand.<pool uid>"),
        Family(subjects.TRAFFIC_STREAM, (TrafficEvent,), "traffic.<client>"),
        Family(subjects.METER_STREAM, (MeterEvent,), "meter.<provider>"),
        Family(subjects.DEADLETTER_STREAM, (DeadLettered,), "deadletter.<consumer>"),
    ]
    listed = [cls.__name__ for family in found for cls in family.members]
    missing = sorted(set(EVENT_TYPES) - set(listed))
    if missing or len(listed) != len(set(listed)):
        raise ValueError(f"give {missing or 'each type'} one stream in tests/support/docgen.py")
    return found


def event_table() -> str:
    rows = ["| type | stream | subject | defined in |", "|---|---|---|---|"]
    for family in families():
        for cls in family.members:
            subject = family.subject.format(category=getattr(cls, "category", ""))
            module = cls.__module__.replace(".", "/") + ".py"
            rows.append(f"| `{cls.__name__}` | `{family.stream}` | `{subject}` | `{module}` |")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# Metrics


def metric_set_factories() -> Iterator[Callable[[CollectorRegistry], object]]:
    """Every class or function in services/ whose only parameter is a ``CollectorRegistry``
    (the convention ``metric_set`` keys on): the code's own list of what it exports."""
    for path in sorted((ROOT / "services").rglob("*.py")):
        if "CollectorRegistry" not in path.read_text():
            continue
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for value in vars(module).values():
            if getattr(value, "__module__", None) != module.__name__ or not callable(value):
                continue
            try:
                parameters = list(inspect.signature(value).parameters.values())
                hints = typing.get_type_hints(value.__init__ if inspect.isclass(value) else value)
            except (TypeError, ValueError, NameError):
                continue
            if len(parameters) == 1 and hints.get(parameters[0].name) is CollectorRegistry:
                yield value


def registry() -> CollectorRegistry:
    """One registry holding every metric set, as ``up`` builds it."""
    built = CollectorRegistry()
    for factory in metric_set_factories():
        metric_set(built, factory)
    return built


@dataclass(frozen=True, slots=True)
class Exported:
    name: str
    kind: str
    labels: tuple[str, ...]
    help: str

    @property
    def shown(self) -> str:
        """The name a query uses: a counter's ``_total``, a histogram's base name."""
        return self.name + ("_total" if self.kind == "counter" else "")


def exported() -> list[Exported]:
    built = registry()
    # prometheus_client keeps label names only on private attributes: a metric object's
    # (``_labelnames``, found through the registry's ``_collector_to_names``) and a custom
    # collector's family's. Read here to document them; nothing in the product relies on it.
    by_name: dict[str, tuple[str, ...]] = {}
    for collector, names in built._collector_to_names.items():
        for name in names:
            by_name[name] = tuple(getattr(collector, "_labelnames", ()))
    found = []
    for family in built.collect():
        labels = getattr(family, "_labelnames", None)
        if labels is None:
            labels = by_name.get(family.name) or by_name.get(family.name + "_total", ())
        labels = tuple(label for label in labels if label != "le")
        found.append(Exported(family.name, family.type, labels, family.documentation))
    return sorted(found, key=lambda e: e.name)


def exported_names() -> set[str]:
    """Every series name a scrape can show, suffixes included."""
    return {e.name + suffix for e in exported() for suffix in SUFFIXES.get(e.kind, ("",))}


def metric_table() -> str:
    rows = ["| metric | type | labels | what |", "|---|---|---|---|"]
    for e in exported():
        labels = ", ".join(f"`{label}`" for label in e.labels)
        text = e.help.replace("|", "/").strip()
        rows.append(f"| `{e.shown}` | {e.kind} | {labels} | {text} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# Service settings


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def value_kind(field: SettingField) -> str:
    """What a setting takes, in words: its type and bounds as the Struct declares them."""
    kind = field.kind
    if isinstance(kind, mi.UnionType):
        (kind,) = [t for t in kind.types if not isinstance(t, mi.NoneType)]
    repeat = isinstance(kind, mi.VarTupleType)
    if isinstance(kind, mi.VarTupleType):
        kind = kind.item_type
    shown = _duration if field.how.duration else _number
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    bounds = ", ".join(f"{signs[k]} {shown(v)}" for k, v in field.bounds.items())
    if field.how.duration:
        text = "duration"
    elif isinstance(kind, mi.IntType):
        text = "integer"
    elif isinstance(kind, mi.FloatType):
        text = "number"
    elif isinstance(kind, mi.BoolType):
        text = f"switch ({field.flag} / {field.how.off})" if field.how.off else "flag"
    elif isinstance(kind, mi.LiteralType):
        text = "one of " + ", ".join(str(v) for v in kind.values)
    elif isinstance(kind, mi.CustomType):
        text = {"file": "file", "dir": "directory"}.get(field.how.path, "path")
        text += " (must exist)" if field.how.exists else ""
    else:
        text = f"`{field.how.metavar}`" if field.how.metavar else "text"
    text = f"{text} {bounds}".strip()
    return f"{text}, repeatable" if repeat else text


def _duration(value: float) -> str:
    return format_duration(value)


def default_text(field: SettingField) -> str:
    value = field.default
    if field.required:
        return "required"
    if value is None or value in ((), ""):
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if field.how.duration:
        return format_duration(value)
    if isinstance(value, int | float):
        return _number(value)
    return str(value)


def settings_rows(cls: type[msgspec.Struct]) -> list[str]:
    """One row per setting of ``cls``: flag, variable, value, default, help."""
    rows = ["| flag | variable | value | default | what |", "|---|---|---|---|---|"]
    for field in setting_fields(cls):
        flag = "" if field.how.env_only else f"`{field.flag}`"
        env = f"`{field.env}`" if field.env else ""
        default = default_text(field)
        text = field.help.replace("|", "/").strip()
        shown = f"`{default}`" if default else ""
        rows.append(f"| {flag} | {env} | {value_kind(field)} | {shown} | {text} |")
    return rows


def settings_tables() -> str:
    """A table per service, in the registry's order; ``up`` takes all of them."""
    parts: list[str] = []
    for entry in SERVICES.values():
        reads = getattr(entry.settings, "reads_env", ())
        parts.append(f"#### `run {entry.name}`\n")
        parts.extend(settings_rows(entry.settings))
        if reads:
            named = ", ".join(f"`{v}`" for v in reads)
            parts.append(f"\nAlso read from the environment only: {named}.")
        parts.append("")
    return "\n".join(parts).rstrip()


# --------------------------------------------------------------------------------------------
# The blocks


BLOCKS: dict[str, tuple[Path, Callable[[], str]]] = {
    "event types": (ARCHITECTURE, event_table),
    "metrics": (OPERATIONS, metric_table),
    "service settings": (OPERATIONS, settings_tables),
}


def render(text: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` holding ``body``; a missing or doubled marker raises."""
    head, tail = begin(name), end(name)
    if text.count(head) != 1 or text.count(tail) != 1:
        raise ValueError(f"the doc must hold the markers of '{name}' once each: {head} ... {tail}")
    before, rest = text.split(head, 1)
    _, after = rest.split(tail, 1)
    return f"{before}{head}\n{body}\n{tail}{after}"


def current(name: str) -> tuple[str, str]:
    """The doc's text now, and what it holds once the block is generated again."""
    path, body = BLOCKS[name]
    text = path.read_text()
    return text, render(text, name, body())


def main() -> None:
    for name, (path, _) in BLOCKS.items():
        text, wanted = current(name)
        if text != wanted:
            path.write_text(wanted)


if __name__ == "__main__":
    main()
