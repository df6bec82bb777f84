"""A service's settings are declared once, on its Struct, and everything else is generated
(docs/decisions/0148-one-settings-struct-per-service.md): a field added to a settings Struct is a
flag of `run NAME` and `up`, read from its variable, bounded, helped, in the docs' table, and in
the Struct the factory receives, with no other edit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import click
import msgspec
import pytest
from click.testing import CliRunner

from services.cli.envoptions import EnvSetting
from services.cli.flags import options, settings_from
from services.cli.main import main
from services.cli.run import registry
from services.cli.run.up_cmd import up
from services.reconciler.service import ReconcilerService, ReconcilerSettings
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import build_settings, setting, setting_fields
from tests.support.clirun import run_parsed
from tests.support.docgen import settings_rows


class Scratch(ReconcilerSettings, frozen=True, kw_only=True):
    """The reconciler's settings and one more, as a developer would add it."""

    scratch_limit: Annotated[int, setting("How far the scratch goes.", ge=2, le=9)] = 5


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Scratch]:
    """The reconciler registered with ``Scratch``; what its factory receives."""
    received: list[Scratch] = []

    def factory(settings: Settings, config: Scratch) -> ReconcilerService:
        received.append(config)
        return ReconcilerService()

    entry = registry.SERVICES["reconciler"]
    scratched = registry.ServiceEntry(entry.name, entry.help, factory, Scratch)
    monkeypatch.setitem(registry.SERVICES, "reconciler", scratched)
    return received


def scratch_option(params: list[click.Parameter]) -> click.Option:
    (found,) = [p for p in params if p.name == "scratch_limit"]
    assert isinstance(found, click.Option)
    return found


def test_the_field_is_an_option_with_its_flag_variable_bounds_default_and_help() -> None:
    option = scratch_option(list(options(Scratch)))
    assert option.opts == ["--scratch-limit"]
    assert option.envvar == "SCRATCH_LIMIT"
    assert isinstance(option.type, click.IntRange)
    assert (option.type.min, option.type.max) == (2, 9)
    assert option.default == 5
    assert option.help == "How far the scratch goes [env SCRATCH_LIMIT]."
    # The reconciler's own settings are still there, in their order, before it.
    names = [f.name for f in setting_fields(Scratch)]
    assert names == [*ReconcilerSettings.__struct_fields__, "scratch_limit"]


def test_run_and_up_take_it(built: list[Scratch], monkeypatch: pytest.MonkeyPatch) -> None:
    run = main.commands["run"]
    assert isinstance(run, click.Group)
    command = run.get_command(click.Context(run), "reconciler")
    assert command is not None
    assert "--scratch-limit" in scratch_option(command.params).opts
    assert "scratch_limit" in [p.name for p in up.get_params(click.Context(up))]
    helped = CliRunner().invoke(main, ["run", "reconciler", "--help"], env={"COLUMNS": "200"})
    assert "--scratch-limit" in helped.output
    assert "[env SCRATCH_LIMIT]" in helped.output
    assert "2<=x<=9" in helped.output

    result, _ = run_parsed(["run", "reconciler", "--scratch-limit", "7"], {}, monkeypatch)
    assert result.exit_code == 0, result.output
    result, _ = run_parsed(["run", "reconciler"], {"SCRATCH_LIMIT": "3"}, monkeypatch)
    assert result.exit_code == 0, result.output
    assert [c.scratch_limit for c in built] == [7, 3]
    assert built[0].reconcile_concurrency == 64


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--scratch-limit", "1"], {}), ([], {"SCRATCH_LIMIT": "10"}), ([], {"SCRATCH_LIMIT": "x"})],
)
def test_a_bad_value_stops_the_start_naming_the_flag_and_the_variable(
    args: list[str], env: dict[str, str], built: list[Scratch], monkeypatch: pytest.MonkeyPatch
) -> None:
    result, started = run_parsed(["run", "reconciler", *args], env, monkeypatch)
    assert result.exit_code == 2
    assert "'--scratch-limit' / SCRATCH_LIMIT" in result.output
    assert (started, built) == (None, [])


def test_values_from_elsewhere_are_checked_by_the_struct() -> None:
    assert build_settings(Scratch, {"scratch_limit": 9, "rotation_drain": None}).scratch_limit == 9
    with pytest.raises(ConfigError, match=r"^--scratch-limit / SCRATCH_LIMIT: expected `int` >= 2"):
        build_settings(Scratch, {"scratch_limit": 1})


def test_the_docs_table_has_a_row_for_it() -> None:
    rows = settings_rows(Scratch)
    assert rows[-1] == (
        "| `--scratch-limit` | `SCRATCH_LIMIT` | integer >= 2, <= 9 | `5` | "
        "How far the scratch goes. |"
    )


def test_a_field_without_a_setting_is_refused() -> None:
    class Bare(msgspec.Struct, frozen=True):
        forgotten: int = 1

    with pytest.raises(TypeError, match=r"Bare\.forgotten"):
        setting_fields(Bare)


def test_two_settings_with_one_name_are_refused() -> None:
    class Twice(msgspec.Struct, frozen=True, kw_only=True):
        inner: ReconcilerSettings = msgspec.field(default_factory=ReconcilerSettings)
        reconcile_concurrency: Annotated[int, setting("Again.")] = 1

    with pytest.raises(TypeError, match="reconcile_concurrency"):
        setting_fields(Twice)


@pytest.mark.parametrize("name", sorted(registry.SERVICES))
def test_every_service_builds_from_its_default_settings(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each default of each Struct is within its own bounds, and the factory takes it."""
    monkeypatch.setenv("EGRESS_LEASE_SECRET", "a lease secret of 32 characters")  # D84
    entry = registry.SERVICES[name]
    defaults = build_settings(entry.settings, {"data_dir": tmp_path})
    assert entry.factory(Settings(), defaults).name == name


class Kinds(msgspec.Struct, frozen=True, kw_only=True):
    """One field of each kind the generator translates."""

    mode: Annotated[Literal["fast", "slow"], setting("How.")] = "fast"
    config: Annotated[Path | None, setting("A file.", path="file", exists=True)] = None
    state_dir: Annotated[Path, setting("A directory.", path="dir")] = Path("state")
    each: Annotated[tuple[str, ...], setting("Repeatable.", env=None, metavar="NAME=URL")] = ()
    elect: Annotated[bool, setting("A switch.", off="--no-elect")] = True
    wait: Annotated[float, setting("A duration.", gt=0, le=3600, duration=True)] = 90.0
    token: Annotated[str, setting("Only from the environment.", env_only=True)] = ""
    port: Annotated[int, setting("A port.", env="SERVICE_PORT", ge=1, le=65535)] = 80


def test_each_kind_of_field_becomes_its_click_equivalent(tmp_path: Path) -> None:
    made = {o.name: o for o in options(Kinds)}
    assert isinstance(made["mode"].type, click.Choice)
    assert list(made["mode"].type.choices) == ["fast", "slow"]
    config = made["config"].type
    assert isinstance(config, click.Path)
    assert (config.exists, config.file_okay, config.dir_okay) == (True, True, False)
    state = made["state_dir"].type
    assert isinstance(state, click.Path)
    assert (state.exists, state.file_okay, state.dir_okay) == (False, False, True)
    assert made["each"].multiple
    assert (made["each"].envvar, made["each"].metavar) == (None, "NAME=URL")
    assert made["each"].help == "Repeatable."  # no variable to name
    assert made["elect"].secondary_opts == ["--no-elect"]
    assert made["wait"].default == "90s"  # shown as it is written
    assert isinstance(made["token"], EnvSetting)
    assert made["token"].envvar == "TOKEN"
    assert made["port"].envvar == "SERVICE_PORT"

    seen: list[Kinds] = []

    @click.command(params=list(made.values()))
    def command(**values: Any) -> None:
        seen.append(settings_from(Kinds, values))

    config_file = tmp_path / "c.yaml"
    config_file.write_text("x")
    args = ["--mode", "slow", "--config", str(config_file), "--each", "a=b", "--each", "c=d"]
    args += ["--no-elect", "--wait", "2m"]
    # Nothing in this process's environment may set the others.
    unset: dict[str, str | None] = {
        o.envvar: None for o in made.values() if isinstance(o.envvar, str)
    }
    env = unset | {"TOKEN": "t", "SERVICE_PORT": "8"}
    result = CliRunner().invoke(command, args, env=env)
    assert result.exit_code == 0, result.output
    assert seen == [
        Kinds(
            mode="slow",
            config=config_file,
            each=("a=b", "c=d"),
            elect=False,
            wait=120.0,
            token="t",
            port=8,
        )
    ]
    for bad in (["--mode", "quick"], ["--config", str(tmp_path / "none")], ["--wait", "2h"]):
        assert CliRunner().invoke(command, bad, env=unset).exit_code == 2, bad
