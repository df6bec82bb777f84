"""Every option of every command says what it does in `--help` (a hidden one, a setting only its
variable sets, has no line there)."""

from __future__ import annotations

import click

from services.cli.main import main


def options_without_help(command: click.Command, path: tuple[str, ...]) -> list[str]:
    ctx = click.Context(command)
    missing = [
        f"{' '.join(path)} {'/'.join(p.opts)}"
        for p in command.get_params(ctx)
        if isinstance(p, click.Option) and not p.hidden and not p.help
    ]
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            missing += options_without_help(sub, (*path, name))
    return missing


def test_every_option_has_help() -> None:
    assert options_without_help(main, ("egress-proxies",)) == []
