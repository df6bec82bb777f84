"""Untrusted text is inert in the terminal.

Names, holders, messages, URLs and the rest come from the event log (which older versions, the
watcher or a compromised writer filled) or from the discovery API. Through the real commands, none
of it may crash a table (``[/bogus]`` is rich markup), style it (``[bold red]``), or reach the
terminal as a control character: escape sequences, carriage returns, bells, C1 codes, bidi
overrides. What the CLI shows is the text with those spelt out (``\\x1b``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from events import subjects
from events.schemas import (
    HealthChanged,
    LeaseAcquired,
    LeaseReported,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import NewEvent
from services.cli.pure.render import clean
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import discovery, ready_proxy
from tests.support.httpthread import serving

pytestmark = pytest.mark.reliability


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield from restore_logging_after()


MARKUP = ("[/bogus]", "[bold red]X[/]", ":thumbs_up:")
CONTROL = (
    "\x1b[31mred\x1b[0m",
    "\x1b]0;pwned\x07",
    "over\rwrite",
    "\x9b2J",
    "gnp\u202eexe",
    "two\nlines",
)
HOSTILE = (*MARKUP, *CONTROL)
# What must never reach the terminal raw: C0 but the line breaks of the layout, DEL, C1, bidi.
UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)


def assert_inert(text: str, shown: tuple[str, ...] = HOSTILE) -> None:
    """Nothing unsafe is raw in ``text``, and each hostile string is there, spelt out."""
    found = UNSAFE.search(text)
    assert found is None, f"raw {found.group()!r} in {text!r}"
    for value in shown:
        assert clean(value) in text, (value, text)


async def seed_hostile(store: JetStreamEventStore) -> None:
    """One proxy whose every shown string is hostile, leased by a hostile holder."""
    uid = "h1"
    spec = ProxySpec(provider="[/bogus]", attributes={"[b]k\x1b": "\x9bv"})
    declared = ProxyDeclared(
        uid=uid, namespace="[bold red]X[/]", name="\x1b[31mred\x1b[0m", spec=spec
    )
    ready = PhaseChanged(
        phase=Phase.READY,
        reason="\x1b]0;pwned\x07",
        message="two\nlines",
        ip="over\rwrite",
        url="http://gnp\u202eexe:3128",
        provider_id=":thumbs_up:",
    )
    verdict = HealthChanged(healthy=False, reason="[/bogus]", message="\x9b2J")
    await store.append(
        subjects.proxy(uid),
        [NewEvent(declared, "h-d"), NewEvent(ready, "h-r"), NewEvent(verdict, "h-h")],
    )
    lease_id = "l-\x1b[2J"
    acquired = LeaseAcquired(lease_id=lease_id, proxy_uid=uid, holder="[/bogus]", ttl_seconds=3600)
    reported = LeaseReported(
        lease_id=lease_id,
        proxy_uid=uid,
        outcome="blocked",
        target="[bold red]X[/]",
        detail="gnp\u202eexe",
    )
    await store.append(
        subjects.lease(uid), [NewEvent(acquired, "h-l"), NewEvent(reported, "h-rep")]
    )


async def test_get_and_events_show_hostile_log_content_inert(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await seed_hostile(jetstream_store)
    url = ("--nats-url", nats_server.url)

    table = await cli("get", *url)
    assert table.exit_code == 0, table.output
    assert_inert(table.stdout, ("[/bogus]", "[bold red]X[/]", "\x1b[31mred\x1b[0m", "over\rwrite"))

    as_json = await cli("get", "-o", "json", *url)
    assert_inert(as_json.stdout, ())
    (item,) = json.loads(as_json.stdout)["items"]
    assert (item["namespace"], item["name"], item["url"]) == (
        "[bold red]X[/]",
        "\x1b[31mred\x1b[0m",
        "http://gnp\u202eexe:3128",
    )
    as_yaml = await cli("get", "-o", "yaml", *url)
    assert_inert(as_yaml.stdout, ())
    assert yaml.safe_load(as_yaml.stdout)["items"][0]["message"] == "two\nlines"

    for stream in ("proxy", "lease"):
        events = await cli("events", "--stream", stream, *url)
        assert events.exit_code == 0, events.output
        assert_inert(events.stdout, ())
        lines = await cli("events", "--stream", stream, "-o", "json", *url)
        assert_inert(lines.stdout, ())
        assert len([json.loads(line) for line in lines.stdout.splitlines()]) >= 2
    proxy_events = (await cli("events", *url)).stdout
    for value in ("[bold red]X[/]", "\x1b[31mred\x1b[0m", "\x1b]0;pwned\x07", "[/bogus]"):
        assert clean(value) in proxy_events


async def test_a_holder_that_is_markup_through_the_real_api(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1")
    async with discovery(nats_server.url) as (_, base):
        got = await cli("lease", "acquire", "--holder", "[/bogus]", DISCOVERY_URL=base)
        assert got.exit_code == 0, got.output
    listed = await cli("get", "--nats-url", nats_server.url)
    assert listed.exit_code == 0, listed.output
    (row,) = listed.stdout.splitlines()[1:]
    assert "[/bogus]" in row.split()


async def test_messages_quoting_names_and_paths_are_inert(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    deleted = await cli("delete", "[/bogus]/[bold red]X[/]", "--nats-url", nats_server.url)
    assert deleted.exit_code == 0, deleted.output
    assert deleted.stdout.strip() == "proxy [/bogus]/[bold red]X[/] absent"

    missing = tmp_path / "\x1b[31mnope\u202e.yaml"
    refused = await cli("apply", "-f", str(missing), "--nats-url", nats_server.url)
    assert refused.exit_code == 2
    assert_inert(refused.stderr, (str(missing),))
    assert refused.stderr.count("\n") == 1


# ------------------------------------------------------------------- a hostile discovery API


class Canned(BaseHTTPRequestHandler):
    """Answers every request with the one canned answer for its method and path."""

    answers: ClassVar[dict[tuple[str, str], tuple[int, dict[str, str], bytes]]] = {}

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        status, headers, body = self.answers[(self.command, self.path)]
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def hostile_api() -> Iterator[str]:
    with serving(Canned) as url:
        yield url


def answer(method: str, path: str, status: int, body: object, **headers: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    Canned.answers[(method, path)] = (status, {"Content-Type": "application/json", **headers}, raw)


LEASE = {
    "id": "[/bogus]\x1b[2J",
    "proxy": {"uid": "u\x9b", "namespace": "[bold red]X[/]", "name": "gnp\u202eexe",
              "url": "http://\x1b]0;pwned\x07:3128"},
    "ttlSeconds": 60,
    "ttlClamped": False,
    "expiresAt": "2099-01-01T00:00:00+00:00",
    "fencingToken": 1,
}  # fmt: skip


async def test_answers_of_a_hostile_api_are_inert(hostile_api: str) -> None:
    env = {"DISCOVERY_URL": hostile_api}
    answer("POST", "/v1/leases", 201, LEASE)
    got = await cli("lease", "acquire", **env)
    assert got.exit_code == 0, got.output
    assert_inert(got.stdout, ("[/bogus]\x1b[2J", "[bold red]X[/]", "gnp\u202eexe"))

    answer("DELETE", "/v1/leases/x", 404, {"error": "unknown_lease", "message": "[/bogus]\x1b[2J"})
    gone = await cli("lease", "release", "x", **env)
    assert gone.exit_code == 7, gone.output
    assert_inert(gone.stderr, ("[/bogus]\x1b[2J",))

    answer("POST", "/v1/leases/x/report", 400,
           {"error": "invalid_request", "message": "bad\nerror: forged\x07"})  # fmt: skip
    refused = await cli("lease", "report", "x", "--outcome", "failed", **env)
    assert refused.exit_code == 2, refused.output
    assert_inert(refused.stderr, ("bad\nerror: forged\x07",))
    assert refused.stderr.count("\n") == 1  # one line: the API cannot forge a second


@pytest.mark.parametrize(
    "case",
    [
        (503, {"error": "no_proxy_available", "message": "[/x]"}, {"Retry-After": "5\x1b[2J"}, 6,
         "try again in 5\\x1b[2J s"),
        (500, b"<html>\x1b[31m oops", {}, 1, "HTTP 500"),
        (201, b"not json \x1b[2J", {}, 1, "answered no JSON"),
        (201, [1, 2], {}, 1, "cannot read"),
        (201, {**LEASE, "expiresAt": "\x1b[2Jsoon"}, {}, 1, "cannot read"),
    ],
)  # fmt: skip
async def test_broken_answers_end_with_one_inert_line(
    hostile_api: str, case: tuple[int, object, dict[str, str], int, str]
) -> None:
    status, body, headers, code, said = case
    answer("POST", "/v1/leases", status, body, **headers)
    result = await cli("lease", "acquire", DISCOVERY_URL=hostile_api)
    assert result.exit_code == code, result.output
    assert said in result.stderr
    assert_inert(result.stderr, ())
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output
