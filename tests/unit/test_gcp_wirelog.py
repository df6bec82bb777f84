"""What the gcp wire log may show: long fields elided unless asked, tokens never."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import click
import msgspec
import pytest
from click.testing import CliRunner

from services.cli.flags import options, settings_from
from services.cli.run.registry import SERVICES, option_names
from services.providers.config import ProviderSettings
from services.providers.gcp.pure import wirelog
from services.runtime.settings.shared import Settings

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJjcmF3bGVyIn0.c2lnbmF0dXJl"
ACCESS_TOKEN = "ya29.a0AfH6SMB-secret_token.value"


@pytest.fixture(autouse=True)
def restore_setting() -> Iterator[None]:
    before = wirelog.full_payloads()
    yield
    wirelog.set_full_payloads(before)


def test_long_string_fields_are_elided_at_any_depth() -> None:
    body = {
        "name": "px-1",
        "diskSizeGb": 10,
        "metadata": {"items": [{"key": "user-data", "value": "a" * 1025}]},
        "tags": {"items": ["x" * 1024]},
    }
    shown = wirelog.payload(str_json(body), full=False)
    assert shown == {
        "name": "px-1",
        "diskSizeGb": 10,
        "metadata": {"items": [{"key": "user-data", "value": "<elided 1025 bytes>"}]},
        "tags": {"items": ["x" * 1024]},  # exactly 1 KiB is not over it
    }


def test_the_limit_counts_bytes_not_characters() -> None:
    assert wirelog.payload(str_json({"v": "é" * 600}), full=False) == {"v": "<elided 1200 bytes>"}


def test_full_payloads_keep_long_fields_but_still_redact() -> None:
    long = "#cloud-config\n" + "x" * 2000 + f"\ntoken: {JWT}\n"
    shown = wirelog.payload(str_json({"value": long}), full=True)
    assert isinstance(shown, dict)
    assert "x" * 2000 in shown["value"]
    assert JWT not in shown["value"]
    assert shown["value"].endswith("token: <redacted>\n")


def test_non_json_bodies_are_text_under_the_same_rules() -> None:
    assert wirelog.payload(b"plain " + ACCESS_TOKEN.encode(), full=False) == "plain <redacted>"
    assert wirelog.payload("y" * 2048, full=False) == "<elided 2048 bytes>"
    assert wirelog.payload(b"", full=False) is None
    assert wirelog.payload(None, full=True) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"Bearer {ACCESS_TOKEN}", "<redacted>"),
        (f"authorization: bearer {JWT}", "authorization: <redacted>"),
        (f"id {JWT} end", "id <redacted> end"),
        (f"tok={ACCESS_TOKEN}", "tok=<redacted>"),
        ("/x?access_token=abc&zone=a", "/x?access_token=<redacted>&zone=a"),
        ("/x?key=AIzaSyD-secret&alt=json", "/x?key=<redacted>&alt=json"),
        ("zones/europe-west1-b/instances/px-1", "zones/europe-west1-b/instances/px-1"),
    ],
)
def test_tokens_are_redacted_wherever_they_hide(text: str, expected: str) -> None:
    assert wirelog.scrub(text) == expected


def test_secret_headers_and_secret_named_fields_are_redacted() -> None:
    headers = wirelog.headers(
        {
            "Authorization": "Bearer abc",
            "x-goog-api-key": "AIza",
            "Cookie": "s=1",
            "Content-Type": "application/json",
            "X-Debug": f"carried {JWT}",
        }
    )
    assert headers == {
        "Authorization": "<redacted>",
        "x-goog-api-key": "<redacted>",
        "Cookie": "<redacted>",
        "Content-Type": "application/json",
        "X-Debug": "carried <redacted>",
    }
    body = {"access_token": "opaque", "id_token": "opaque", "privateKey": "-----BEGIN", "key": "k"}
    assert wirelog.payload(str_json(body), full=True) == {
        "access_token": "<redacted>",
        "id_token": "<redacted>",
        "privateKey": "<redacted>",
        "key": "k",  # metadata items are {key, value}: a field named key is no secret
    }


def test_the_flag_sets_the_process_wide_setting() -> None:
    @click.command()
    def command(**values: object) -> None:
        # The flag acts when the settings it belongs to are applied, as the factories do.
        settings: ProviderSettings = settings_from(ProviderSettings, values)
        settings.apply()
        click.echo(f"full={wirelog.full_payloads()}")

    command.params.extend(options(ProviderSettings))
    runner = CliRunner()
    assert runner.invoke(command, []).output == "full=False\n"
    assert runner.invoke(command, ["--gcp-wire-log-full-payloads"]).output == "full=True\n"
    env = {"GCP_WIRE_LOG_FULL_PAYLOADS": "true"}
    assert runner.invoke(command, [], env=env).output == "full=True\n"


def test_the_factories_apply_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`run executor` / `run gc` / `up` set it when they build the service."""
    monkeypatch.setenv("EGRESS_LEASE_SECRET", "a lease secret of 32 characters")  # D84
    for name in ("executor", "gc"):
        entry = SERVICES[name]
        assert "gcp_wire_log_full_payloads" in option_names(entry)
        for full in (True, False):
            providers = ProviderSettings(data_dir=tmp_path, gcp_wire_log_full_payloads=full)
            config = msgspec.structs.replace(entry.settings(), providers=providers)
            entry.factory(Settings(), config)
            assert wirelog.full_payloads() is full


def str_json(value: object) -> str:
    return json.dumps(value)
