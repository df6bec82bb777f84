"""The HTTP plumbing the local cloud API fakes share (digitalocean, hetzner, gcp, aws's front).

The cloud providers are tested through their real client libraries (pydo, hcloud,
google-cloud-compute, aiobotocore) pointed at a local server, so request encoding, signing,
paging, error decoding and timeouts are the libraries' own, not a mock's (docs/providers.md,
each provider's "testing without the cloud"). Every fake needs the same things around the API it
imitates: a server on a free loopback port in a thread, faults queued per call kind and answered
instead of the call, stalls to trip a client's timeout, a close that does not wait for a stalled
answer. They live here once, so a fix (a client that hung up, a stall outliving the test) reaches
every fake; what each API answers stays in its cloud's module of the test kit
(``services.testing.<type>``).

Not pure (threads and sockets), and only for tests: the import contract of the test kit keeps
the product from importing it (D150).
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

ANY = "any"
NO_BODY = frozenset({204, 304})


@dataclass(frozen=True)
class Request:
    """One request as the fake received it."""

    method: str
    target: str
    """The path with its query, as sent."""
    headers: tuple[tuple[str, str], ...]
    """In the order and case sent (a proxying fake passes them on)."""
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)

    @property
    def params(self) -> dict[str, str]:
        """The query with the last value of each name, as most APIs read a repeated one."""
        return {name: values[-1] for name, values in self.query.items()}

    def header(self, name: str, default: str = "") -> str:
        wanted = name.lower()
        return next((v for k, v in self.headers if k.lower() == wanted), default)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


def merge_headers(*layers: Mapping[str, str]) -> dict[str, str]:
    """Later layers win, names compared without case: an injected ``RateLimit-Reset`` replaces
    the fake's own ``ratelimit-reset`` instead of going out beside it."""
    merged: dict[str, str] = {}
    for layer in layers:
        for name, value in layer.items():
            for existing in [k for k in merged if k.lower() == name.lower()]:
                del merged[existing]
            merged[name] = value
    return merged


def json_reply(
    status: int,
    answer: object | None,
    headers: Mapping[str, str] | None = None,
    *,
    content_type: str = "application/json",
) -> Reply:
    """``answer`` as JSON; None is no body (and no Content-Type, as for a 204)."""
    if answer is None:
        return Reply(status, b"", tuple((headers or {}).items()))
    layers = merge_headers({"Content-Type": content_type}, headers or {})
    return Reply(status, json.dumps(answer).encode(), tuple(layers.items()))


def parse_json(body: bytes) -> dict[str, Any]:
    """The request's JSON object; anything else (garbage, a list) reads as empty, which the
    fake's own checks then refuse the way the API does."""
    try:
        decoded = json.loads(body or b"{}")
    except ValueError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


@dataclass
class Fault:
    """An answer given instead of a call: ``status`` with the API's error ``code`` and
    ``message`` (each fake renders its own error shape), for the next ``remaining`` calls.
    ``stall`` holds the call first; a fault with ``status`` 0 only stalls, then the call is
    answered as usual."""

    status: int
    code: str
    message: str = ""
    remaining: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    stall: float = 0.0


class FakeServer:
    """A ThreadingHTTPServer on a free loopback port, for a ``with`` block; subclasses answer
    in ``serve``, which runs on the server's threads (take ``self._lock`` for shared state).

    ``kinds`` are the call kinds faults may name (empty: any name); a fault for ``any_kind``
    answers the next call of any kind whose own queue is empty.
    """

    thread_name = "fake-http"

    def __init__(self, kinds: Sequence[str] = (), *, any_kind: str = ANY) -> None:
        self.kinds = tuple(kinds)
        self.any_kind = any_kind
        self._lock = threading.RLock()
        self._faults: dict[str, deque[Fault]] = {}
        self._stalls: dict[str, float] = {}
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, request: Request) -> Reply:
        raise NotImplementedError

    # ---------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        assert self._server is not None, "start the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        self._closing.clear()
        server = _Server(("127.0.0.1", 0), _handler(self))
        self._server = server
        # A short poll interval: stop() waits for one, and tests stop a fake each.
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name=self.thread_name, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; a stalled answer is released rather than waited for."""
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- faults and stalls

    def check_kind(self, kind: str) -> None:
        if self.kinds and kind not in self.kinds:
            raise ValueError(f"unknown call kind {kind!r}; use one of {', '.join(self.kinds)}")

    def add_fault(self, kind: str, fault: Fault) -> None:
        """Queue ``fault`` for the next calls of ``kind``, after those already queued."""
        self.check_kind(kind)
        with self._lock:
            self._faults.setdefault(kind, deque()).append(fault)

    def stall(self, kind: str, seconds: float, *, times: int | None = None) -> None:
        """Hold the answers to ``kind`` for ``seconds`` (a slow API, to trip the client's
        timeout): every answer from now on, or only the next ``times``."""
        self.check_kind(kind)
        with self._lock:
            if times is None:
                self._stalls[kind] = seconds
            else:
                self._faults.setdefault(kind, deque()).append(
                    Fault(0, "", "", times, stall=seconds)
                )

    def fault_for(self, kind: str) -> Fault | None:
        """The fault this call of ``kind`` is answered with, if any, after its stalls."""
        self.hold(self._stalls.get(kind, 0.0))
        with self._lock:
            fault = self._take(kind)
        if fault is None:
            return None
        self.hold(fault.stall)
        return fault if fault.status else None

    def hold(self, seconds: float) -> None:
        """Wait ``seconds``, or until the fake stops."""
        if seconds > 0:
            self._closing.wait(seconds)

    def _take(self, kind: str) -> Fault | None:
        for key in (kind, self.any_kind):
            queue = self._faults.get(key)
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


def _handler(fake: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the clients' sessions expect
        # Headers and body leave in separate writes: without this, delayed ACKs cost 40 ms each.
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            request = Request(self.command, self.path, tuple(self.headers.items()), body)
            reply = fake.serve(request)
            self.send_response(reply.status, HTTPStatus(reply.status).phrase)
            _send_headers(self, reply.headers)
            if reply.status not in NO_BODY:
                self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            if reply.body and reply.status not in NO_BODY:
                self.wfile.write(reply.body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: each fake keeps its own record of what was asked."""

    return Handler


def _send_headers(handler: BaseHTTPRequestHandler, headers: Iterable[tuple[str, str]]) -> None:
    for name, value in headers:
        if name.lower() not in ("content-length", "connection", "transfer-encoding"):
            handler.send_header(name, value)
