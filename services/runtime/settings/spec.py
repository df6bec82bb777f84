"""A service's settings as one frozen msgspec Struct: each field's type, default, bounds and help
written once (docs/decisions/0148-one-settings-struct-per-service.md).

A field is annotated with ``setting(...)``: the help, the bounds (``ge``/``gt``/``le``/``lt``,
which msgspec itself checks) and how an operator gives it (``How``: the flag, the variable, a
metavar). A field the program sets itself is listed in the Struct's ``internal``; variables a
service reads itself (a secret no settings object should hold) in its ``reads_env``.
A field whose type is a Struct contributes that Struct's fields (the providers' settings are part
of the executor's and the gc's), so a setting shared by services is declared once. The command
line (``services.cli.flags``), the environment variables (D74: ``--gc-grace`` reads ``GC_GRACE``)
and the docs' flag tables are generated from these fields; nothing here knows click, so a service
module declares its settings without importing the CLI's library.

``build_settings`` turns parsed values into the Struct and checks them again, so a value that
reaches a service by any way other than the command line still fails at start-up naming its flag
and its variable.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec
import msgspec.inspect as mi

from services.runtime.settings.envnames import env_name
from services.runtime.settings.errors import ConfigError

S = TypeVar("S", bound=msgspec.Struct)

_HOW = "egress.how"
"""The key of ``How`` in a field's ``Meta.extra``."""


class How(msgspec.Struct, frozen=True, kw_only=True):
    """How an operator gives a setting: what a click option holds that a type does not."""

    flag: str = ""
    """The long flag; empty: the field's name, ``--reconcile-concurrency``."""
    env: str | None = ""
    """The variable; empty: derived from the flag (D74); None: the flag has none."""
    off: str = ""
    """A switch's negative flag (``--no-leader-election``); empty for a plain on-flag."""
    metavar: str = ""
    duration: bool = False
    """Seconds written as ``30s``, ``5m``, ``1h`` or a number; the default is shown so too."""
    path: Literal["", "file", "dir"] = ""
    """A path to a file (not a directory) or a directory (not a file)."""
    exists: bool = False
    """A path that must exist when the command starts."""
    env_only: bool = False
    """Read from the variable alone: no flag, no line in ``--help`` (a password)."""
    show_default: bool = True


def setting(
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    **how: Any,
) -> msgspec.Meta:
    """The ``Annotated`` metadata of a setting: ``Annotated[int, setting("...", ge=1)] = 64``."""
    # Passed as a mapping: the stubs' overloads spell out which bounds mix, as msgspec checks.
    attrs: dict[str, Any] = {"ge": ge, "gt": gt, "le": le, "lt": lt}
    meta: msgspec.Meta = msgspec.Meta(description=help, extra={_HOW: How(**how)}, **attrs)
    return meta


@dataclass(frozen=True, slots=True)
class SettingField:
    """One setting as the generators see it: a field of a settings Struct, nested ones
    flattened."""

    name: str
    """The field's name, which is also the click parameter's."""
    kind: mi.Type
    """Its type without the metadata: bounds on an ``IntType``/``FloatType``, a
    ``LiteralType``'s choices, a ``VarTupleType`` for a repeatable flag."""
    default: Any
    help: str
    how: How
    owner: type[msgspec.Struct]
    required: bool = False

    @property
    def flag(self) -> str:
        return self.how.flag or "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str | None:
        """The variable that sets it, or None (a flag only)."""
        if self.how.env is None:
            return None
        return self.how.env or env_name(self.flag)

    @property
    def named(self) -> str:
        """How a message names it: ``--metrics-port / METRICS_PORT``."""
        if self.how.env_only:
            return str(self.env)
        return f"{self.flag} / {self.env}" if self.env else self.flag

    @property
    def bounds(self) -> dict[str, float]:
        found = {}
        for key in ("ge", "gt", "le", "lt"):
            value = getattr(self.kind, key, None)
            if value is not None:
                found[key] = value
        return found


@functools.cache
def setting_fields(cls: type[msgspec.Struct]) -> tuple[SettingField, ...]:
    """The settings of ``cls`` in declaration order, each nested Struct's in its place; two
    with one name raise (one flag would set both)."""
    found: list[SettingField] = []
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    internal: frozenset[str] = getattr(cls, "internal", frozenset())
    for field in info.fields:
        if field.name in internal:
            continue
        kind, extra, text = field.type, None, ""
        if isinstance(kind, mi.Metadata):
            extra, text = kind.extra, (kind.extra_json_schema or {}).get("description", "")
            kind = kind.type
        if isinstance(kind, mi.StructType):
            found.extend(setting_fields(kind.cls))
            continue
        how = (extra or {}).get(_HOW)
        if not isinstance(how, How):
            raise TypeError(f"{cls.__name__}.{field.name}: annotate it with setting(...)")
        default = field.default if field.default is not msgspec.NODEFAULT else None
        found.append(SettingField(field.name, kind, default, text, how, cls, field.required))
    names = [f.name for f in found]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise TypeError(f"{cls.__name__}: settings named twice: {', '.join(doubled)}")
    return tuple(found)


def field_named(cls: type[msgspec.Struct], name: str) -> SettingField:
    for found in setting_fields(cls):
        if found.name == name:
            return found
    raise KeyError(name)


def _decode(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str | Path):
        return Path(value)
    # msgspec reports a TypeError as a ValidationError at the field, which names the flag.
    raise TypeError(f"Expected `{kind.__name__}`, got `{type(value).__name__}`")


def build_settings(cls: type[S], values: Mapping[str, Any]) -> S:
    """``cls`` from ``values`` keyed by field name (nested Structs' fields flat, as the command
    line has them); a value missing or None keeps its default. Bounds and types are checked here
    as well as by click: a ``ConfigError`` names the flag and the variable."""
    return _build(cls, values)


def _build(cls: type[S], values: Mapping[str, Any]) -> S:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    given: dict[str, Any] = {}
    for field in info.fields:
        kind = field.type.type if isinstance(field.type, mi.Metadata) else field.type
        if isinstance(kind, mi.StructType):
            given[field.name] = _build(kind.cls, values)
        elif values.get(field.name) is not None:
            given[field.name] = values[field.name]
    try:
        return msgspec.convert(given, cls, dec_hook=_decode)
    except msgspec.ValidationError as exc:
        raise ConfigError(_message(cls, str(exc))) from None


def _message(cls: type[msgspec.Struct], text: str) -> str:
    """msgspec's ``Expected `int` <= 4096 - at `$.reconcile_concurrency``` as ``--reconcile-
    concurrency / RECONCILE_CONCURRENCY: expected `int` <= 4096``."""
    what, _, where = text.rpartition(" - at `$.")
    if not what:
        return text
    name = where.rstrip("`").split(".")[-1].split("[")[0]
    try:
        named = field_named(cls, name).named
    except KeyError:
        return text
    return f"{named}: {what[:1].lower()}{what[1:]}"
