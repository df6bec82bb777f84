"""The gcp provider's wire log, end to end through the real client: long fields elided unless
asked, tokens never shown, records inside a span carrying its ids; and the fake's own endpoints."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud.compute_v1 import Operation, ZoneOperationsClient
from google.oauth2.credentials import Credentials
from opentelemetry.sdk.trace import TracerProvider

from services.providers.base import NotFound, Transient
from services.providers.gcp.provider import UBUNTU_IMAGE, GcpProvider
from services.runtime.observability.logs import configure_logging
from services.testing.gcp import ComputeFake
from tests.support.gcp_support import PROJECT, ZONE, compute_fake, config, gcp_provider, request  # noqa: F401  # fixtures `fake` and `gcp`

pytestmark = pytest.mark.integration

tracer = TracerProvider().get_tracer("tests.gcp")


# ----------------------------------------------------------------------------- wire log


@pytest.fixture
def wire() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    saved = structlog.get_config()
    stream = io.StringIO()
    configure_logging("debug", "json", stream)
    try:
        yield stream
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**saved)


def wire_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in lines if line.get("logger") == "egress.provider.gcp.wire"]


JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJjcmF3bGVyIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
ACCESS_TOKEN = "ya29.a0AfH6SMBfake-access-token"
BIG_CLOUD_INIT = "#cloud-config\nwrite_files:\n  - content: " + "x" * 2000 + f"\n# {JWT}\n"


@pytest.mark.parametrize("full", [False, True])
async def test_wire_log_elides_long_fields_hides_tokens_and_names_the_span(
    fake: ComputeFake, wire: io.StringIO, full: bool
) -> None:
    provider = GcpProvider(
        "gcp-eu",
        config(fake, image=UBUNTU_IMAGE),  # a #cloud-config runs where cloud-init does (D140)
        full_payloads=full,
        credentials=Credentials(token=ACCESS_TOKEN),  # type: ignore[no-untyped-call]
    )
    try:
        with tracer.start_as_current_span("provider.create") as span:
            await provider.create(request("px-wire", cloud_init=BIG_CLOUD_INIT))
        await provider.get(f"zones/{ZONE}/instances/px-wire")  # outside any span
    finally:
        await provider.close()
    raw = wire.getvalue()
    assert ACCESS_TOKEN not in raw
    assert JWT not in raw
    # The machine type is looked up in the catalogue before the insert (D140).
    looked_up, offered, request_line, response_line, outside, _ = wire_lines(wire)
    assert looked_up["url"].endswith(f"/zones/{ZONE}/machineTypes/e2-small")
    context = span.get_span_context()
    for line in (looked_up, offered, request_line, response_line):
        assert line["traceID"] == format(context.trace_id, "032x")
        assert line["spanID"] == format(context.span_id, "016x")
        assert line["level"] == "debug"
    assert "traceID" not in outside
    assert request_line["event"] == "gcp request"
    assert request_line["method"] == "POST"
    assert request_line["headers"]["authorization"] == "<redacted>"
    assert response_line["status"] == 200
    (item,) = request_line["body"]["metadata"]["items"]
    if full:
        # The Proxy's cloud-init is the first part of the user data, the guard part follows.
        assert "#cloud-config\nwrite_files:" in item["value"]
        assert "x" * 2000 in item["value"]
        assert "<redacted>" in item["value"]
    else:
        elided = re.fullmatch(r"<elided (\d+) bytes>", item["value"])
        assert elided
        assert int(elided[1]) > len(BIG_CLOUD_INIT.encode())
    assert request_line["body"]["name"] == "px-wire"  # short fields stay


async def test_no_wire_log_above_debug(fake: ComputeFake, wire: io.StringIO) -> None:
    configure_logging("info", "json", wire)
    provider = GcpProvider("gcp-eu", config(fake))
    try:
        await provider.create(request("px-quiet"))
    finally:
        await provider.close()
    assert wire_lines(wire) == []


async def test_a_failed_request_is_logged_with_its_error(
    fake: ComputeFake, wire: io.StringIO
) -> None:
    provider = GcpProvider("gcp-eu", config(fake, timeout_seconds=0.2))
    fake.stall("get", 1.0)
    try:
        with pytest.raises(Transient):
            await provider.get(f"zones/{ZONE}/instances/px-slow")
    finally:
        await provider.close()
    sent, failed = wire_lines(wire)
    assert sent["event"] == "gcp request"
    assert failed["event"] == "gcp request failed"
    assert failed["url"] == sent["url"]
    assert "ReadTimeout" in failed["error"]


# ----------------------------------------------------------------------------- the fake itself


async def test_the_fake_serves_zone_operations_and_faults_for_any_call(
    gcp: GcpProvider, fake: ComputeFake
) -> None:
    """The provider never waits on an operation, but the fake's operations must still decode
    with the real client, like everything else it answers."""
    client = ZoneOperationsClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        transport="rest",
        client_options=ClientOptions(api_endpoint=fake.url),
    )
    try:
        operation = await asyncio.to_thread(
            client.get, project=PROJECT, zone=ZONE, operation="operation-7"
        )
        assert (operation.name, operation.status) == ("operation-7", Operation.Status.DONE)
        fake.inject(503, "backendError", times=2)  # the next two calls, whatever they are
        with pytest.raises(Transient):
            await gcp.list_by_tag()
        with pytest.raises(Transient):
            await gcp.get(f"zones/{ZONE}/instances/px-any")
        with pytest.raises(NotFound):
            await gcp.get(f"zones/{ZONE}/instances/px-any")
        with pytest.raises(ValueError, match="unknown call kind"):
            fake.inject(500, "x", kind="restart")
    finally:
        client.transport.close()  # type: ignore[no-untyped-call]
