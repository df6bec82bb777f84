"""Options a variable sets too: the variable's name, how help shows it, and variable-only
settings."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from services.cli.envoptions import EnvSetting, env_option, env_values, with_env_option
from services.runtime.settings.envnames import env_name


@pytest.mark.parametrize(
    ("flag", "variable"),
    [
        ("--health-check-url", "HEALTH_CHECK_URL"),
        ("--kubeconfig", "KUBECONFIG"),
        ("--leader-election/--no-leader-election", "LEADER_ELECTION"),
        ("nats_password", "NATS_PASSWORD"),
    ],
)
def test_the_variable_is_derived_from_the_long_flag(flag: str, variable: str) -> None:
    assert env_name(flag) == variable


def test_help_shows_the_variable_in_one_format() -> None:
    derived = env_option("-o", "--gc-grace", help="Spare young instances.")
    assert derived.envvar == "GC_GRACE"
    assert derived.help == "Spare young instances [env GC_GRACE]."
    named = env_option("--lease-namespace", env="POD_NAMESPACE", help="Where the Lease is")
    assert named.envvar == "POD_NAMESPACE"
    assert named.help == "Where the Lease is [env POD_NAMESPACE]."


def test_an_option_without_a_long_flag_must_name_its_variable() -> None:
    with pytest.raises(TypeError, match="env="):
        env_option("-x", help="Nothing to derive from.")


def test_a_variable_only_setting_is_read_typed_and_kept_out_of_help() -> None:
    seen: list[dict[str, object]] = []

    @click.command()
    @click.option("secret_port", cls=EnvSetting, type=int)
    @with_env_option("--name", default="x", help="A name.")
    def command(name: str) -> None:
        seen.append({"name": name, **env_values(click.get_current_context())})

    runner = CliRunner()
    assert runner.invoke(command, [], env={"SECRET_PORT": "7", "NAME": "n"}).exit_code == 0
    assert seen == [{"name": "n", "secret_port": 7}]
    helped = runner.invoke(command, ["--help"]).output
    assert "SECRET_PORT" not in helped
    assert "[env NAME]" in helped
    bad = runner.invoke(command, [], env={"SECRET_PORT": "seven"})
    assert bad.exit_code == 2
    assert "SECRET_PORT" in bad.output
    assert runner.invoke(command, ["--secret-port", "7"]).exit_code == 2  # no such flag
