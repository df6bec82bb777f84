"""Bad input ends with one line and a documented exit code, never a traceback.

Files an operator names (``apply -f``, ``delete -f``, ``--providers-config``) may be anything: a
directory, unreadable, binary, Latin-1, UTF-16. A provider type may lack its optional dependency.
``DISCOVERY_TOKEN`` may hold what no ``Authorization`` header can carry. Each is exit 2 with the
path or the variable named.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from services.cli.main import main
from services.runtime.bearer import TOKEN_ENV, token_from_env
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.settings.errors import ConfigError
from tests.support.clirun import cli, restore_logging_after

pytestmark = pytest.mark.reliability


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield from restore_logging_after()


ROOT = Path(__file__).resolve().parents[2]
EXIT_USAGE = 2


def one_line_error(result: Result, *said: str) -> None:
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    for text in said:
        assert text in result.stderr, (text, result.stderr)


BAD_FILES: dict[str, tuple[bytes | None, str]] = {
    "binary.yaml": (b"\x7fELF\x02\x01\x01\x00\x00\x00", "a binary file"),
    "latin1.yaml": (b"metadata: {name: caf\xe9}\n", "not UTF-8 text (byte 0xe9 at offset 20)"),
    "utf16.yaml": ("kind: Proxy\n".encode("utf-16"), "UTF-16 text"),
    "missing.yaml": (None, "cannot read it (No such file or directory)"),
    "not-yaml.yaml": (b"kind: [Proxy\n", "not valid YAML: "),
    "empty.yaml": (b"# nothing\n", "no Proxy documents"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["apply", "delete"])
async def test_a_bad_declarations_file_is_one_line(
    tmp_path: Path, nats_server: EmbeddedNatsServer, command: str, name: str
) -> None:
    content, problem = BAD_FILES[name]
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    result = await cli(command, "-f", str(path), "--nats-url", nats_server.url)
    one_line_error(result, str(path), problem)


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        (".", "cannot read it (Is a directory)"),
        # Opens, then refuses to be read: the CLI's own memory, at address 0.
        ("/proc/self/mem", "cannot read it (Input/output error)"),
        ("/dev/zero", "a binary file (a NUL byte at offset 0)"),
    ],
)
async def test_a_file_that_cannot_be_read_is_one_line(path: str, problem: str) -> None:
    one_line_error(await cli("apply", "-f", path), path, problem)


async def test_binary_standard_input_is_one_line() -> None:
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["apply", "-f", "-"], input=b"\xff\xfe\x00\x01"
    )
    one_line_error(result, "standard input", "UTF-16 text")


@pytest.mark.parametrize("name", ["binary.yaml", "latin1.yaml", "utf16.yaml", "not-yaml.yaml"])
async def test_a_bad_providers_config_is_one_line(
    tmp_path: Path, jetstream_store: JetStreamEventStore, nats_server: EmbeddedNatsServer, name: str
) -> None:
    content, problem = BAD_FILES[name]
    assert content is not None
    path = tmp_path / name
    path.write_bytes(content)
    result = await cli(
        "gc", "run-once", "--dry-run", "--providers-config", str(path),
        "--nats-url", nats_server.url,
    )  # fmt: skip
    one_line_error(result, f"--providers-config {path}", problem.replace("YAML: ", "YAML"))


# ------------------------------------------------------------------ a missing optional module


async def run_without(tmp_path: Path, module: str, *args: str) -> tuple[int, str]:
    """The CLI as a process in which ``module`` cannot be imported, as when the extra that
    installs it is not: a module of that name on the path first, failing the way a missing one
    does."""
    shadow = tmp_path / "shadow"
    shadow.mkdir(exist_ok=True)
    (shadow / f"{module}.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(shadow), "OTEL_SDK_DISABLED": "true"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli.main", *args,
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, (out + err).decode()


async def run_without_libvirt(tmp_path: Path, *args: str) -> tuple[int, str]:
    return await run_without(tmp_path, "libvirt", *args)


@pytest.mark.parametrize(
    "command",
    [("gc", "run-once", "--dry-run"), ("run", "executor"), ("run", "gc")],
)
async def test_a_provider_type_without_its_extra_names_the_extra(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text("providers:\n  - {name: vms, type: kvm, kvm: {}}\n")
    code, output = await run_without_libvirt(
        tmp_path, *command, "--providers-config", str(config), "--nats-url", "nats://127.0.0.1:1"
    )
    assert code == EXIT_USAGE, output
    assert "Traceback" not in output
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "providers[0] (vms): type kvm needs the Python module libvirt" in line
    assert "pip install 'egress-proxies[kvm]'" in line


@pytest.mark.parametrize(
    ("kind", "module", "block"),
    [
        ("aws", "aiobotocore", "{region: eu-west-1, allowedClients: [203.0.113.0/24]}"),
        ("digitalocean", "pydo", "{allowedClients: [203.0.113.0/24]}"),
        ("hetzner", "hcloud", "{allowedClients: [203.0.113.0/24]}"),
    ],
)
async def test_a_cloud_type_without_its_extra_names_the_extra(
    tmp_path: Path, kind: str, module: str, block: str
) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text(f"providers:\n  - {{name: vms, type: {kind}, {kind}: {block}}}\n")
    code, output = await run_without(
        tmp_path, module, "up", "--providers-config", str(config), "--data-dir",
        str(tmp_path / "data"),
    )  # fmt: skip
    assert code == EXIT_USAGE, output
    assert "Traceback" not in output
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert f"providers[0] (vms): type {kind} needs the Python module {module}" in line
    assert f"pip install 'egress-proxies[{kind}]'" in line


async def test_without_libvirt_every_other_provider_still_works(tmp_path: Path) -> None:
    config = tmp_path / "providers.yaml"
    config.write_text("providers:\n  - {name: f, type: fake, fake: {}}\n")
    code, output = await run_without_libvirt(
        tmp_path, "gc", "run-once", "--dry-run", "--providers-config", str(config),
        "--nats-url", "nats://127.0.0.1:1",
    )  # fmt: skip
    assert code == 3, output  # got as far as connecting
    assert "cannot reach nats-server" in output


# ----------------------------------------------------------------------------------- tokens

BAD_TOKENS = {
    "caf\u00e9-token": "character 4 of the token: U+00E9 is not allowed",
    "two\nlines": "character 4 of the token: U+000A is not allowed",
    "has space": "character 4 of the token: a space is not allowed",
    "semi;colon": "character 5 of the token: ';' is not allowed",
    "pad=ding": "character 4 of the token: '=' is only allowed as padding at the end",
}


@pytest.mark.parametrize("token", sorted(BAD_TOKENS))
def test_a_token_that_is_no_bearer_token_is_refused(token: str) -> None:
    with pytest.raises(ConfigError, match=TOKEN_ENV) as caught:
        token_from_env({TOKEN_ENV: token})
    message = str(caught.value)
    assert BAD_TOKENS[token] in message
    assert token not in message  # a secret: where it breaks, never what it holds
    assert "\n" not in message


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("abc-DEF_012.~+/", "abc-DEF_012.~+/"),
        ("bWFueSBieXRlcw==", "bWFueSBieXRlcw=="),
        ("  from-a-file\n", "from-a-file"),
        ("", None),
        (" \n", None),
    ],
)
def test_bearer_tokens_are_accepted(value: str, token: str | None) -> None:
    assert token_from_env({TOKEN_ENV: value}) == token


@pytest.mark.parametrize(
    "args",
    [("acquire",), ("release", "l-1"), ("report", "l-1", "--outcome", "failed")],
)
async def test_lease_commands_refuse_a_bad_token(args: tuple[str, ...]) -> None:
    # The URL is never reached: the token is checked first.
    result = await cli("lease", *args, DISCOVERY_URL="http://127.0.0.1:1", DISCOVERY_TOKEN="é\n")
    one_line_error(result, TOKEN_ENV, "U+00E9")


async def test_the_discovery_service_refuses_a_bad_token_at_start_up() -> None:
    # Exit 2, not 3: refused before it would connect to the (unreachable) server.
    result = await cli(
        "run", "discovery", "--nats-url", "nats://127.0.0.1:1", DISCOVERY_TOKEN="tok en"
    )
    one_line_error(result, TOKEN_ENV, "a space is not allowed")
