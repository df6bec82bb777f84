"""A local HTTP fake of the DigitalOcean API endpoints the digitalocean provider calls.

The provider is tested through the real ``pydo`` async client (``endpointUrl`` pointing here), so
request encoding, paging and error decoding are the library's own, not a mock's. The fake follows
DigitalOcean's public API reference for the calls used:

- ``/v2/droplets``: POST (202, ``status: new``), GET list (``tag_name`` or ``name``, ``page`` /
  ``per_page`` up to 200, ``links.pages`` and ``meta.total``), GET by id, DELETE by id (204);
- ``/v2/firewalls``: POST (202), GET list, GET by id, PUT by id (the whole firewall), DELETE (204);
  a firewall may name only tags that exist, and must have a valid name and rules;
- ``/v2/tags``: GET by name, POST (201);
- the Bearer token is checked on every call (401 ``Unauthorized`` otherwise); errors have
  DigitalOcean's shape, ``{"id": "...", "message": "..."}``, and every answer carries the
  ``ratelimit-*`` headers.

A droplet moves ``new`` -> ``active`` one step per GET of it, getting a public IPv4 address from
``addresses`` (by default distinct 127.0.1.x addresses; the e2e passes ``["127.0.0.1"]`` so a
local Squid stands in for every droplet). ``inject`` answers the next calls of a kind with an
error (status, DigitalOcean error id, message, headers); ``power_off``, ``destroy`` and
``archive`` act behind the provider's back; ``droplet_limit`` refuses creates as the account
limit does. The account itself (what each call answers) is ``fakeapi.FakeAccount``; this module
is the HTTP server around it, the token check, the faults and the controls.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from services.providers.digitalocean import fakeapi
from services.providers.digitalocean.fakeapi import (
    IMAGES,
    LIMIT_MESSAGE,
    REGIONS,
    SIZES,
    Answer,
    Droplet,
    FakeAccount,
    parse_json,
)

__all__ = [
    "DEFAULT_TOKEN",
    "IMAGES",
    "KINDS",
    "LIMIT_MESSAGE",
    "REGIONS",
    "SIZES",
    "DigitalOceanFake",
    "Droplet",
]

KINDS = (
    "droplets.create",
    "droplets.list",
    "droplets.get",
    "droplets.delete",
    "firewalls.create",
    "firewalls.list",
    "firewalls.get",
    "firewalls.update",
    "firewalls.delete",
    "tags.get",
    "tags.create",
    "any",
)
DEFAULT_TOKEN = "dop_v1_fake_token_for_tests"


@dataclass
class _Fault:
    status: int
    error_id: str
    message: str
    headers: dict[str, str]
    remaining: int


class DigitalOceanFake(FakeAccount):
    """The fake server; use as a context manager (``with DigitalOceanFake() as fake``). The
    account's state (``droplets``, ``firewalls``, ``tags``) is readable by tests."""

    def __init__(
        self, *, token: str = DEFAULT_TOKEN, addresses: Sequence[str] | None = None
    ) -> None:
        super().__init__(addresses)
        self.token = token
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.calls: list[str] = []
        self._faults: dict[str, deque[_Fault]] = {kind: deque() for kind in KINDS}
        self._stalls: dict[str, float] = {}
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- control

    @property
    def url(self) -> str:
        assert self._server is not None, "start the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> DigitalOceanFake:
        server = _Server(("127.0.0.1", 0), _handler(self))
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="do-fake")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> DigitalOceanFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def inject(
        self,
        kind: str,
        status: int,
        error_id: str,
        message: str = "",
        *,
        headers: dict[str, str] | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next ``times`` calls of ``kind`` with this DigitalOcean error."""
        if kind not in KINDS:
            raise ValueError(f"unknown call kind {kind!r}; use one of {', '.join(KINDS)}")
        text = message or f"injected {error_id} ({status})"
        with self._lock:
            self._faults[kind].append(_Fault(status, error_id, text, dict(headers or {}), times))

    def stall(self, kind: str, seconds: float) -> None:
        """Delay every answer to ``kind`` (a slow API, to trip the client's timeout)."""
        with self._lock:
            self._stalls[kind] = seconds

    def power_off(self, droplet_id: int) -> None:
        with self._lock:
            self.droplets[droplet_id].body["status"] = "off"
            self.droplets[droplet_id].steps.clear()

    def archive(self, droplet_id: int) -> None:
        with self._lock:
            self.droplets[droplet_id].body["status"] = "archive"
            self.droplets[droplet_id].steps.clear()

    def destroy(self, droplet_id: int) -> None:
        """Destroy behind the provider's back (a person in the control panel)."""
        with self._lock:
            del self.droplets[droplet_id]

    def delete_firewall(self, firewall_id: str) -> None:
        with self._lock:
            del self.firewalls[firewall_id]

    def put(self, name: str, tags: list[str], status: str = "active") -> int:
        """A droplet made by someone else, for listing tests."""
        with self._lock:
            droplet_id = next(self._ids)
            body = self._droplet_body(droplet_id, {"name": name, "tags": tags}, status)
            self.droplets[droplet_id] = Droplet(body, deque())
            self.tags.update(tags)
            return droplet_id

    def calls_of(self, kind: str) -> int:
        with self._lock:
            return self.calls.count(kind)

    def by_name(self, name: str) -> list[Droplet]:
        with self._lock:
            return [d for d in self.droplets.values() if d.body["name"] == name]

    # ---------------------------------------------------------------- dispatch

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Answer:
        url = urlsplit(target)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        route = fakeapi.route(method, url.path)
        with self._lock:
            self.requests.append((method, url.path, query))
            if route is not None:
                self.calls.append(route[0])
        if headers.get("authorization", "") != f"Bearer {self.token}":
            return fakeapi.error(401, "Unauthorized", "Unable to authenticate you")
        if route is None:
            return fakeapi.error(
                404, "not_found", "The resource you were accessing could not be found."
            )
        kind, arg = route
        if self._stalls.get(kind):
            time.sleep(self._stalls[kind])
        with self._lock:
            fault = self._take_fault(kind)
            if fault is not None:
                status, answer, extra = fakeapi.error(fault.status, fault.error_id, fault.message)
                return status, answer, {**extra, **fault.headers}
            return self.answer(
                kind, arg, base=self.url, path=url.path, query=query, payload=parse_json(body)
            )

    def _take_fault(self, kind: str) -> _Fault | None:
        for queue in (self._faults[kind], self._faults["any"]):
            if queue:
                fault = queue[0]
                fault.remaining -= 1
                if fault.remaining <= 0:
                    queue.popleft()
                return fault
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up (a timeout test) is expected; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def _handler(fake: DigitalOceanFake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, answer, extra = fake.handle(self.command, self.path, headers, body)
            data = json.dumps(answer).encode() if answer is not None else b""
            self.send_response(status, HTTPStatus(status).phrase)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("ratelimit-limit", "5000")
            self.send_header("ratelimit-remaining", "4999")
            if "ratelimit-reset" not in {k.lower() for k in extra}:
                self.send_header("ratelimit-reset", str(int(time.time()) + 60))
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if data:
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: ``fake.requests`` records what was asked."""

    return Handler
