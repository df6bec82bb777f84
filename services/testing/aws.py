"""An EC2 endpoint for tests without AWS: moto's emulator as a real process (``MotoEc2``), and a
front (``FaultFront``) that answers what moto never does.

The provider is tested through the real aiobotocore client pointed at these (``endpointUrl``), so
signing, request encoding and error parsing are the library's own, not a mock's. moto answers
the calls we make the way EC2 does (instances, subnets, VPCs, security groups, tag filters, spot)
but never refuses for quota, never throttles and never fails with a 5xx; the front sits between
the client and moto and answers the next N requests of a given Action with an injected EC2 error
(the XML shape, HTTP status and ``Retry-After`` EC2 uses), or stalls them, or refuses every
request of an Action as a missing IAM permission, and forwards every other request untouched.
``MotoEc2.offer`` takes an instance type away from zones of moto's catalogue.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

import services
from services.runtime.ports import free_port
from services.testing import cloud_http
from services.testing.cloud_http import Fault, Reply, Request

ROOT = Path(services.__file__).resolve().parents[1]
"""Where ``python -m`` finds the launcher: the folder of the ``services`` package, wherever
this module sits in it."""
START_TIMEOUT = 60.0
ANY_ACTION = "*"
XML = (("Content-Type", "text/xml;charset=UTF-8"),)


class MotoEc2:
    """``python -m services.testing.aws_moto`` on a free port, for a ``with`` block.

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
            command = [sys.executable, "-m", "services.testing.aws_moto"]
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

    def offer(self, region: str, instance_type: str, zones: Sequence[str]) -> None:
        """Make ``instance_type`` offered in exactly ``zones`` of ``region`` (none: not in the
        region), in the catalogue and at launch, until the next ``reset``."""
        body = json.dumps({"region": region, "instanceType": instance_type, "zones": list(zones)})
        request = urllib.request.Request(
            f"{self.url}/egress-proxies/offerings", method="POST", data=body.encode()
        )
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


def error_body(code: str, message: str) -> bytes:
    """EC2's error answer, as its Query API sends it."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


class FaultFront(cloud_http.FakeServer):
    """A reverse proxy in front of ``upstream`` (moto) that fails chosen Actions; ``actions``
    lists the Action of every request it received, in order, and ``bodies`` their forms."""

    thread_name = "ec2-front"

    def __init__(self, upstream: str) -> None:
        super().__init__(any_kind=ANY_ACTION)
        self.upstream = urlsplit(upstream)
        self.actions: list[str] = []
        self.bodies: list[dict[str, list[str]]] = []
        self.denied: set[str] = set()

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
        headers = {"Retry-After": retry_after} if retry_after else {}
        self.add_fault(action, Fault(status, code, message or f"injected {code}", times, headers))

    def deny(self, *actions: str) -> None:
        """Answer every request of ``actions`` from now on as EC2 answers a caller whose IAM
        policy does not allow them: ``UnauthorizedOperation`` (HTTP 403), a dry run included
        (moto, which checks no policy, answers a dry run ``DryRunOperation`` always)."""
        with self._lock:
            self.denied |= set(actions)

    def stall(self, kind: str, seconds: float, *, times: int | None = 1) -> None:
        """Hold the next ``times`` requests of Action ``kind`` for ``seconds``, then forward
        them (None: every one from now on)."""
        super().stall(kind, seconds, times=times)

    def count(self, action: str) -> int:
        with self._lock:
            return self.actions.count(action)

    def serve(self, request: Request) -> Reply:
        if request.method != "POST":
            return self._forward(request)
        form = parse_qs(request.body.decode("utf-8", "replace"))
        action = (form.get("Action") or [""])[0]
        with self._lock:
            self.bodies.append(form)
            self.actions.append(action)
        if action in self.denied:
            message = (
                "You are not authorized to perform this operation. User: "
                f"arn:aws:iam::123456789012:user/egress is not authorized to perform: ec2:{action} "
                f"because no identity-based policy allows the ec2:{action} action"
            )
            return Reply(403, error_body("UnauthorizedOperation", message), XML)
        fault = self.fault_for(action)
        if fault is None:
            return self._forward(request)
        headers = {"Content-Type": "text/xml;charset=UTF-8", **fault.headers}
        return Reply(fault.status, error_body(fault.code, fault.message), tuple(headers.items()))

    def _forward(self, request: Request) -> Reply:
        connection = http.client.HTTPConnection(
            self.upstream.hostname or "127.0.0.1", self.upstream.port, timeout=60
        )
        try:
            headers = {k: v for k, v in request.headers if k.lower() != "connection"}
            body = request.body or None
            connection.request(request.method, request.target, body=body, headers=headers)
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        return Reply(response.status, payload, tuple(response.getheaders()))
