"""Click options that their environment variable sets too (D74), and settings only a variable
sets (``EnvSetting``), for the commands that declare options by hand; a service's options are
generated from its settings Struct instead (``services.cli.flags``).

A setting no flag should carry (a password on a command line is visible to every user of the
machine) is an ``EnvSetting``: click still reads, types and checks it, so the parameters of a
command name every variable it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from services.runtime.settings.envnames import env_help, env_name

F = TypeVar("F", bound=Callable[..., Any])

_ENV_VALUES = "egress.env_settings"
"""Where ``EnvSetting`` keeps what it read, in ``Context.meta`` (shared by nested contexts)."""


def _variable(decls: Sequence[str], env: str | None) -> str:
    if env:
        return env
    flags = [d for d in decls if d.startswith("--")]
    if not flags:
        raise TypeError(f"{decls!r}: no long flag to derive a variable from; pass env=")
    return env_name(flags[0])


def env_option(*decls: str, env: str | None = None, help: str, **attrs: Any) -> click.Option:
    """A ``click.Option`` that its variable (``env``, else derived from the long flag) sets too;
    for commands that list their options."""
    var = _variable(decls, env)
    return click.Option(list(decls), envvar=var, help=env_help(help, var), **attrs)


def with_env_option(
    *decls: str, env: str | None = None, help: str, **attrs: Any
) -> Callable[[F], F]:
    """``env_option`` as a decorator, for commands declared with ``@click.command``."""
    var = _variable(decls, env)
    return click.option(*decls, envvar=var, help=env_help(help, var), **attrs)


def _keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if param.name:
        ctx.meta.setdefault(_ENV_VALUES, {})[param.name] = value
    return value


class EnvSetting(click.Option):
    """A parameter only its variable sets: no flag, no line in ``--help``.

    Its value does not reach the command's function, which would otherwise have to take every
    setting, used or not; ``env_values`` reads it back. An option at heart, so the ``click.option``
    decorator can attach it (``cls=EnvSetting``) and a bad value is a usage error naming the
    variable.
    """

    def __init__(self, param_decls: Sequence[str], **attrs: Any) -> None:
        (name,) = param_decls
        attrs.setdefault("envvar", env_name(name))
        attrs.setdefault("callback", _keep)
        super().__init__([name], expose_value=False, hidden=True, **attrs)

    def _parse_decls(
        self, decls: Sequence[str], expose_value: bool
    ) -> tuple[str, list[str], list[str]]:
        return decls[0], [], []

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        """Nothing on the command line to parse: the value comes from the variable alone."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        return str(self.envvar)


def env_values(ctx: click.Context) -> dict[str, Any]:
    """What the ``EnvSetting`` parameters of ``ctx``'s command (and its groups') read: None for
    a variable that is unset, unless the parameter has a default."""
    found: dict[str, Any] = ctx.meta.get(_ENV_VALUES, {})
    return dict(found)
