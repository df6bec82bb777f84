"""Whatever a cloud endpoint answers, a provider raises one class of the taxonomy, never an
exception of its client library: an ``endpointUrl`` pointing at the wrong server, a proxy in the
way, a cloud having a bad day. The executor acts on the class alone, so an unclassified error
would be a crash of the command instead of a retry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler
from typing import Any

import msgspec
import pytest

from services.providers.aws.config import AwsConfig
from services.providers.aws.provider import AwsProvider
from services.providers.base import Provider, ProviderError
from services.providers.digitalocean.config import DigitalOceanConfig
from services.providers.digitalocean.provider import DigitalOceanProvider
from services.providers.hetzner.config import HetznerConfig
from services.providers.hetzner.provider import HetznerProvider
from tests.contract.provider import assert_classified
from tests.support.cloud_requests import cloud_request
from tests.support.httpthread import serving

pytestmark = pytest.mark.integration

ANSWERS: dict[str, tuple[int, str, bytes]] = {
    "html-200": (200, "text/html", b"<html><body>Welcome to nginx!</body></html>"),
    "truncated-json": (200, "application/json", b'{"droplets": [{"id": 1, "na'),
    "wrong-shape": (200, "application/json", b'{"servers": 7, "droplet": "x", "meta": []}'),
    "json-null": (200, "application/json", b"null"),
    "html-502": (502, "text/html", b"<html>Bad Gateway</html>"),
    "empty-500": (500, "text/plain", b""),
    "xml-nonsense": (200, "text/xml", b"<Response><Reservations>\x00</Response>"),
}


class Garbage(BaseHTTPRequestHandler):
    answer: tuple[int, str, bytes] = ANSWERS["html-200"]

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        status, kind, body = self.answer
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _reply

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(params=sorted(ANSWERS))
def endpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Answer", (Garbage,), {"answer": ANSWERS[request.param]})
    with serving(handler) as url:
        yield url


def providers(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> list[Provider]:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
        "HCLOUD_TOKEN": "hz-garbage-test-token",
    }.items():
        monkeypatch.setenv(name, value)
    common: dict[str, Any] = {
        "allowedClients": ["203.0.113.0/24"],
        "endpointUrl": endpoint,
        "timeoutSeconds": 5,
    }
    aws = msgspec.convert({**common, "region": "eu-west-1", "image": "ami-12c6146b"}, AwsConfig)
    do = msgspec.convert(common, DigitalOceanConfig)
    hz = msgspec.convert(common, HetznerConfig)
    return [
        AwsProvider("aws-g", aws),
        DigitalOceanProvider("do-g", do, token="do-garbage-test-token"),
        HetznerProvider("hz-g", hz),
    ]


IDS = {"aws": "i-0123456789abcdef0", "digitalocean": "3164444", "hetzner": "40000001"}


def calls(provider: Provider) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
    pid = IDS[provider.type]
    request = cloud_request(provider.name, "px-garbage")
    return [("create", lambda: provider.create(request)), ("get", lambda: provider.get(pid))]


async def outcome(call: Callable[[], Awaitable[object]]) -> BaseException | None:
    try:
        await call()
    except Exception as exc:
        return exc
    return None


async def test_every_call_on_a_garbage_answer_is_one_class_of_the_taxonomy(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for provider in providers(endpoint, monkeypatch):
        try:
            for label, call in calls(provider):
                raised = await outcome(call)
                # create and get cannot succeed on garbage: each says why, classified.
                assert raised is not None, f"{provider.type} {label}: garbage taken as an answer"
                assert isinstance(raised, ProviderError), f"{provider.type} {label}: {raised!r}"
                assert_classified(raised)
                assert raised.args, f"{provider.type} {label}: the error must say why"
            # A listing may read a body without servers as none (GC then deletes nothing), and a
            # delete may succeed (a 2xx answer to a delete is a delete); neither may crash.
            raised = await outcome(provider.list_by_tag)
            assert raised is None or isinstance(raised, ProviderError), repr(raised)
            raised = await outcome(partial(provider.delete, IDS[provider.type]))
            assert raised is None or isinstance(raised, ProviderError), repr(raised)
        finally:
            await provider.close()
