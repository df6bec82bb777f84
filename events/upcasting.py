"""Reading events stored in an older shape, or under an older name, as the current ones.

The log is immutable: an event written today is read again by every later version for the
stream's whole retention. So a change to an event's shape is one of three kinds:

- **Additive**: a new field with a default. Old payloads decode as they are (the default fills
  in) and old readers ignore the field. No new schema, nothing here.
- **A shape an old payload cannot decode into**: a field renamed, its type, unit or meaning
  changed, one event split in two. ``SCHEMA_VERSION`` (``events.schemas``) goes up by one, and
  a *step* registered in ``STEPS`` under (the type's current name, the schema it upgrades
  from) turns the stored JSON object of that schema into the next one's shape. The codec
  chains the steps from the schema in the message's ``Egress-Schema`` header up to the
  current one before the object becomes a Struct, so no fold ever sees an old shape. A type
  with no step for a version is taken to be unchanged by it.
- **A type renamed**: ``RENAMES`` maps the old name to the new one, whatever the schema. Steps
  are keyed by the current name only.

A step works on the JSON object as decoded (strings for times, plain numbers, camelCase keys
where the Struct renames them), takes the object it is given (it may change it) and returns the
object of the next schema. It runs on untrusted input: whatever it raises makes the message
undecodable (skipped, counted, dead-lettered by consumers), never a crash.

A rolling upgrade runs readers before writers (docs/operations.md, "Upgrades"): a build reads
schemas up to ``READS_UP_TO``, which is its own ``SCHEMA_VERSION`` unless a release *before*
the one that writes the next schema raised it and registered *read-ahead* steps (keyed by the
newer schema, turning its shape into this build's). An event of a schema newer than that is
skipped like a type this build does not know.

Pure: the codec holds the one registry, ``UPCASTERS``, and ``tests/unit/test_golden_log.py``
checks it against the golden logs in ``tests/golden``: every (type, schema) any version wrote
decodes to a current type and folds into the same views.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from events.base import Event
from events.schemas import EVENT_TYPES, SCHEMA_VERSION

Step = Callable[[dict[str, Any]], dict[str, Any]]
"""One schema's JSON object of one type in, the next schema's (towards the current) out."""

FIRST_SCHEMA = 1
"""The schema of the first release. Every writer has stamped ``Egress-Schema`` since then, so a
message without the header was not written by our store (a hand-made publish); it is read as
this, the oldest shape, and the steps bring it forward."""

MAX_SCHEMA_DIGITS = 9
"""A header with more digits than this is a schema no build will ever write: it is read as
"newer than this build" without turning the digits into a number (Python refuses to convert
more than 4300 digits, and would take a while below that)."""

STEPS: dict[tuple[str, int], Step] = {}
"""(current type name, the schema the step upgrades from) -> step. Empty: no event has changed
shape since the first schema. An example, had ``HealthChanged.latency_ms`` been ``latency`` in
seconds up to schema 1::

    def _health_changed_1(obj: dict[str, Any]) -> dict[str, Any]:
        obj["latency_ms"] = obj.pop("latency", 0.0) * 1000.0
        return obj

    STEPS = {("HealthChanged", 1): _health_changed_1}   # and SCHEMA_VERSION = 2
"""

RENAMES: dict[str, str] = {}
"""Old type name -> current type name. Empty: no type has been renamed."""

READS_UP_TO = SCHEMA_VERSION
"""The newest schema this build decodes. Raise it to ``SCHEMA_VERSION + 1`` (with read-ahead
steps for the types whose next shape this build cannot decode as is) one release before the
release that writes that schema."""


@dataclass(frozen=True)
class Upcasters:
    """The registry: which schemas a build reads and how each old shape becomes the current one.

    Checked when it is built: a step or rename that could never apply, or a rename that leads
    nowhere or in a circle, is a bug in the build and raises ``ValueError`` at import.
    """

    current: int
    """The schema this build writes, whose shapes its Structs have."""
    types: Mapping[str, type[Event]] = field(default_factory=lambda: EVENT_TYPES)
    steps: Mapping[tuple[str, int], Step] = field(default_factory=dict)
    renames: Mapping[str, str] = field(default_factory=dict)
    oldest: int = FIRST_SCHEMA
    """The oldest schema any writer stamped; a header below it is not a schema at all."""
    reads_up_to: int | None = None
    """The newest schema this build reads (None: ``current``)."""

    def __post_init__(self) -> None:
        found = self.problems()
        if found:
            raise ValueError("the upcaster registry is inconsistent: " + "; ".join(found))

    @property
    def newest(self) -> int:
        return self.current if self.reads_up_to is None else self.reads_up_to

    @cached_property
    def current_text(self) -> str:
        """``current`` as writers put it in the header: the fast path compares strings."""
        return str(self.current)

    def problems(self) -> list[str]:
        found: list[str] = []
        if not self.oldest <= self.current <= self.newest:
            found.append(
                f"schemas must run oldest <= current <= newest read, "
                f"not {self.oldest}, {self.current}, {self.newest}"
            )
        for name, schema in self.steps:
            if name not in self.types:
                why = "a renamed type's" if name in self.renames else "an unknown"
                found.append(
                    f"step ({name!r}, {schema}) names {why} type: "
                    "key steps by the type's current name"
                )
            if schema == self.current or not self.oldest <= schema <= self.newest:
                found.append(
                    f"step ({name!r}, {schema}) can never run: this build reads schemas "
                    f"{self.oldest} to {self.newest} and writes {self.current}"
                )
        for old, new in self.renames.items():
            if old in self.types:
                found.append(f"rename {old!r} -> {new!r}: {old!r} is a current type")
            elif self.current_name(old) is None:
                found.append(f"rename {old!r} -> {new!r} leads to no current type (or in a circle)")
        return found

    def knows(self, name: str) -> bool:
        return name in self.types or name in self.renames

    def current_name(self, name: str) -> str | None:
        """The current name of a type stored as ``name``; None for a type this build does not
        know (or a rename table that loops, which ``problems`` reports)."""
        for _ in range(len(self.renames) + 1):
            if name in self.types:
                return name
            renamed = self.renames.get(name)
            if renamed is None:
                return None
            name = renamed
        return None

    def shape(self, name: str, schema: int, obj: dict[str, Any]) -> dict[str, Any]:
        """``obj``, stored at ``schema`` as type ``name`` (its current name), in the current
        shape: each version's step in turn, towards ``current``."""
        obj["type"] = name
        direction = 1 if schema < self.current else -1
        version = schema
        while version != self.current:
            step = self.steps.get((name, version))
            if step is not None:
                obj = step(obj)
                obj["type"] = name
            version += direction
        return obj


UPCASTERS = Upcasters(current=SCHEMA_VERSION, steps=STEPS, renames=RENAMES, reads_up_to=READS_UP_TO)
"""The registry the codec reads with."""
