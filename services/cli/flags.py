"""Click options generated from a settings Struct (``services.runtime.settings.spec``).

A field's type, default, bounds and help are written once, on the Struct; here they become what
``run NAME`` and ``up`` parse (docs/decisions/0148-one-settings-struct-per-service.md): an
``int`` with ``ge``/``le`` an ``IntRange``, a ``Literal`` a ``Choice``, a ``Path`` a
``click.Path``, a ``tuple`` a repeatable flag, a ``bool`` a flag (or a ``--x/--no-x`` switch),
a duration a type that reads ``30s`` or ``5m``; the variable is the flag's (D74) and the help
ends with it. A setting only its variable sets is an ``EnvSetting``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import msgspec
import msgspec.inspect as mi

from events.durations import format_duration
from services.cli.envoptions import EnvSetting, env_values
from services.runtime.settings.durations import duration_seconds
from services.runtime.settings.envnames import env_help
from services.runtime.settings.spec import SettingField, build_settings, setting_fields


class Duration(click.ParamType[float]):
    """Seconds from ``30s``, ``5m``, ``1h``, ``1h30m``, ``250ms`` or a number; click's error
    names the flag and the variable it came from."""

    name = "duration"

    def __init__(self, *, positive: bool = False, maximum: float | None = None) -> None:
        self.positive = positive
        self.maximum = maximum

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        try:
            return duration_seconds(
                value if number else str(value), positive=self.positive, maximum=self.maximum
            )
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class SettingOption(click.Option):
    """An option generated from a setting: an error names its variable as well as its flag,
    since a deployment sets the variable and may never have typed the flag."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        hint = super().get_error_hint(ctx)
        return f"{hint} / {self.envvar}" if isinstance(self.envvar, str) else hint


def _number(kind: mi.IntType | mi.FloatType) -> click.ParamType[Any]:
    low = kind.ge if kind.ge is not None else kind.gt
    high = kind.le if kind.le is not None else kind.lt
    if low is None and high is None:
        return click.INT if isinstance(kind, mi.IntType) else click.FLOAT
    opens = {"min_open": kind.gt is not None, "max_open": kind.lt is not None}
    if isinstance(kind, mi.IntType):
        return click.IntRange(
            None if low is None else int(low), None if high is None else int(high), **opens
        )
    return click.FloatRange(low, high, **opens)


def _plain(kind: mi.Type) -> mi.Type:
    """``X | None`` as ``X``: None is what click passes for an unset option."""
    if isinstance(kind, mi.UnionType):
        (kind,) = [t for t in kind.types if not isinstance(t, mi.NoneType)]
    return kind


def click_type(field: SettingField) -> click.ParamType[Any]:
    """The click type of one value of ``field`` (of each value, for a repeatable one)."""
    kind = _plain(field.kind)
    if isinstance(kind, mi.VarTupleType):
        kind = kind.item_type
    if field.how.duration:
        assert isinstance(kind, mi.FloatType)
        return Duration(positive=kind.gt == 0, maximum=kind.le)
    if isinstance(kind, mi.IntType | mi.FloatType):
        return _number(kind)
    if isinstance(kind, mi.LiteralType):
        return click.Choice([str(v) for v in kind.values])
    if isinstance(kind, mi.CustomType) and kind.cls is Path:
        return click.Path(
            exists=field.how.exists,
            file_okay=field.how.path != "dir",
            dir_okay=field.how.path != "file",
            path_type=Path,
        )
    if isinstance(kind, mi.BoolType):
        return click.BOOL
    if isinstance(kind, mi.StrType):
        return click.STRING
    raise TypeError(f"{field.owner.__name__}.{field.name}: no click type for {kind!r}")


def _default(field: SettingField) -> Any:
    if field.how.duration and isinstance(field.default, int | float):
        return format_duration(field.default)
    return field.default


def option(field: SettingField, *, env_only: bool | None = None, **override: Any) -> click.Option:
    """The click option of ``field``; ``env_only`` makes it an ``EnvSetting`` (or a flag) for a
    command that reads a shared setting from its variable only, ``override`` changes an attribute
    (``default``) for a command whose default differs by nature (``up``'s metrics port)."""
    attrs: dict[str, Any] = {"type": click_type(field), "default": _default(field)}
    if field.required:
        attrs = {"type": attrs["type"], "required": True}
    if isinstance(_plain(field.kind), mi.VarTupleType):
        attrs["multiple"] = True
    if field.how.env_only if env_only is None else env_only:
        return EnvSetting([field.name], envvar=field.env, **attrs | override)
    if isinstance(field.kind, mi.BoolType) and not field.how.off:
        attrs |= {"is_flag": True, "type": None}
    if field.how.metavar:
        attrs["metavar"] = field.how.metavar
    if field.how.show_default:
        attrs["show_default"] = True
    env = field.env
    decl = f"{field.flag}/{field.how.off}" if field.how.off else field.flag
    return SettingOption(
        [decl, field.name],
        envvar=env,
        help=env_help(field.help, env) if env else field.help,
        **attrs | override,
    )


def options(cls: type[msgspec.Struct], **overrides: dict[str, Any]) -> tuple[click.Option, ...]:
    """The options of every setting of ``cls``, in its order; ``overrides`` maps a field's name
    to attributes that change for this command."""
    return tuple(option(f, **overrides.get(f.name, {})) for f in setting_fields(cls))


def settings_from(cls: type[msgspec.Struct], values: dict[str, Any]) -> Any:
    """The Struct from what click parsed: the command's values and what its ``EnvSetting``
    parameters read. A bad value fails naming its flag and variable (``ConfigError``)."""
    return build_settings(cls, env_values(click.get_current_context()) | values)
