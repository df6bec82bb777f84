"""An EC2 endpoint for tests without AWS: moto's emulator as a real process (``MotoEc2``), and a
front (``FaultFront``) that answers what moto never does.

The provider is tested through the real aiobotocore client pointed at these (``endpointUrl``), so
signing, request encoding and error parsing are the library's own, not a mock's. moto answers
the calls we make the way EC2 does (instances, subnets, VPCs, security groups, tag filters, spot)
but never refuses for quota, never throttles and never fails with a 5xx; the front sits between
the client and moto and answers the next N requests of a given Action with an injected EC2 error
(the XML shape, HTTP status and ``Retry-After`` EC2 uses), or stalls them, and forwards every
other request untouched.
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

from services.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT = 60.0
ANY_ACTION = "*"


class MotoEc2:
    """``python -m services.providers.aws.motoserver`` on a free port, for a ``with`` block.

    ``public_ips``: the addresses instances get, in turn (the launcher's docstring says why).
    """

    def __init__(self, public_ips: Sequence[str] = ()) -> None:
        self.public_ips = list(public_ips)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log")  # noqa: SIM115 - closed in stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        for _ in range(3):  # a port taken between the choice and the bind: choose again
            self.port = free_port()
            command = [sys.executable, "-m", "services.providers.aws.motoserver"]
            command += ["--port", str(self.port)]
            if self.public_ips:
                command += ["--public-ips", ",".join(self.public_ips)]
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT
            )
            if self._wait_ready():
                return
        raise RuntimeError(f"moto did not start: {self.log_tail()}")

    def _wait_ready(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/data.json", timeout=2):
                    return True
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto not answering after {START_TIMEOUT}s: {self.log_tail()}")

    def reset(self) -> None:
        """Forget every resource (the default VPC comes back), as a fresh process would."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=30):
            pass

    def log_tail(self, size: int = 4000) -> str:
        return Path(self._log.name).read_bytes()[-size:].decode(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> MotoEc2:
        try:
            self.start()
        except BaseException:
            self.stop()
            self._log.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._log.close()


# ---------------------------------------------------------------- the fault-injecting front


@dataclass
class Fault:
    code: str
    status: int
    message: str
    remaining: int
    retry_after: str = ""
    stall: float = 0.0
    """Seconds to hold the request before answering (or forwarding, when ``code`` is empty)."""


def error_body(code: str, message: str) -> bytes:
    """EC2's error answer, as its Query API sends it."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


class FaultFront:
    """A reverse proxy in front of ``upstream`` (moto) that fails chosen Actions; ``actions``
    lists the Action of every request it received, in order."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.actions: list[str] = []
        self.bodies: list[dict[str, list[str]]] = []
        self._faults: dict[str, deque[Fault]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the front first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def inject(
        self,
        action: str,
        code: str,
        *,
        status: int = 400,
        message: str = "",
        times: int = 1,
        retry_after: str = "",
    ) -> None:
        """Answer the next ``times`` requests of ``action`` (``*``: of any) with this error."""
        fault = Fault(code, status, message or f"injected {code}", times, retry_after)
        with self._lock:
            self._faults.setdefault(action, deque()).append(fault)

    def stall(self, action: str, seconds: float, *, times: int = 1) -> None:
        """Hold the next ``times`` requests of ``action`` for ``seconds``, then forward them."""
        with self._lock:
            self._faults.setdefault(action, deque()).append(Fault("", 0, "", times, stall=seconds))

    def count(self, action: str) -> int:
        with self._lock:
            return self.actions.count(action)

    def _take(self, action: str) -> Fault | None:
        with self._lock:
            self.actions.append(action)
            for key in (action, ANY_ACTION):
                queue = self._faults.get(key)
                if queue:
                    fault = queue[0]
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        queue.popleft()
                    return fault
        return None

    def start(self) -> None:
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                form = parse_qs(body.decode("utf-8", "replace"))
                with front._lock:
                    front.bodies.append(form)
                fault = front._take((form.get("Action") or [""])[0])
                if fault is not None and fault.stall:
                    front._closing.wait(fault.stall)
                if fault is not None and fault.code:
                    self._answer(fault)
                else:
                    self._forward("POST", body)

            def do_GET(self) -> None:
                self._forward("GET", None)

            def _answer(self, fault: Fault) -> None:
                payload = error_body(fault.code, fault.message)
                self.send_response(fault.status)
                self.send_header("Content-Type", "text/xml;charset=UTF-8")
                self.send_header("Content-Length", str(len(payload)))
                if fault.retry_after:
                    self.send_header("Retry-After", fault.retry_after)
                self.end_headers()
                self.wfile.write(payload)

            def _forward(self, method: str, body: bytes | None) -> None:
                upstream = front.upstream
                connection = http.client.HTTPConnection(
                    upstream.hostname or "127.0.0.1", upstream.port, timeout=60
                )
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    connection.request(method, self.path, body=body, headers=headers)
                    response = connection.getresponse()
                    payload = response.read()
                finally:
                    connection.close()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                del format, args

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultFront:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
