"""A local fake of a residential or ISP proxy service, the kind the ``upstream`` provider type
leases sticky sessions from: ``UpstreamService`` starts ``python -m
services.testing.upstream_server`` as a process of its own (a real HTTP proxy, as the service's
gateway is one) and drives its control API.

    with UpstreamService(
        "oxylabs", account="acme", password="s3cret",
        countries={"de": "127.0.2.1-127.0.2.20", "fr": "127.0.3.1-127.0.3.20"},
    ) as service:
        ... fetch through service.endpoint with "customer-acme-cc-DE-sessid-ab12cd34" ...
        service.drop("ab12cd34")           # its next request takes another exit
        service.fail(429, times=2, retry_after=7)
        assert service.session("ab12cd34", "de")["bytesDown"] > 0

What the service does with a login, an exit, a fault: ``upstream_server`` (the process),
``upstream_logins`` (the grammars), ``upstream_exits`` (sessions, exits, faults, traffic). The
password reaches the process through its environment, never its command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

from services.testing.upstream_server import PASSWORD_ENV

START_TIMEOUT = 30.0
ROOT = Path(__file__).resolve().parents[2]


class ControlError(RuntimeError):
    """The control API refused a call; ``status`` and the API's reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class UpstreamService:
    """The fake service's process for a ``with`` block; ``endpoint`` is its gateway
    (``host:port``), as a provider entry names a service's."""

    def __init__(
        self,
        grammar: str,
        *,
        account: str,
        password: str,
        countries: Mapping[str, str | Sequence[str]],
        session_seconds: float = 600.0,
        zone: str = "",
        user_template: str = "",
        password_template: str = "",
        regex: str = "",
    ) -> None:
        self.grammar = grammar
        self.account = account
        self.password = password
        self.countries = dict(countries)
        self.session_seconds = session_seconds
        self.zone = zone
        self.templates = (user_template, password_template, regex)
        self.proxy_port = 0
        self.control_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="upstream-", suffix=".log")  # noqa: SIM115 - closed in stop()

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.proxy_port}"

    def proxy_url(self, user: str, password: str | None = None) -> str:
        """The proxy URL for a client, with this login (the account's password by default)."""
        secret = self.password if password is None else password
        return f"http://{quote(user, safe='')}:{quote(secret, safe='')}@{self.endpoint}"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "services.testing.upstream_server"]
        command += ["--grammar", self.grammar, "--account", self.account]
        command += ["--session-seconds", str(self.session_seconds)]
        for country, exits in self.countries.items():
            listed = exits if isinstance(exits, str) else ",".join(exits)
            command += ["--country", f"{country}={listed}"]
        if self.zone:
            command += ["--zone", self.zone]
        for flag, value in zip(
            ("--user-template", "--password-template", "--regex"), self.templates, strict=True
        ):
            if value:
                command += [flag, value]
        return command

    def start(self) -> Self:
        environment = {**os.environ, PASSWORD_ENV: self.password}
        self.process = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        ports = self._ports()
        self.proxy_port, self.control_port = ports["proxy"], ports["control"]
        return self

    def _ports(self) -> dict[str, int]:
        """The ports the process prints once it listens; its log when it dies or says nothing
        in time."""
        assert self.process is not None
        stdout = self.process.stdout
        assert stdout is not None
        found: list[bytes] = []
        reading = threading.Thread(target=lambda: found.append(stdout.readline()), daemon=True)
        reading.start()
        reading.join(START_TIMEOUT)
        line = found[0] if found else b""
        try:
            ports = json.loads(line)
            return {"proxy": int(ports["proxy"]), "control": int(ports["control"])}
        except (ValueError, KeyError, TypeError):
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(timeout=10)
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"the fake service did not start: {tail}") from None

    def log_tail(self, size: int = 4000) -> str:
        if self._log.closed:
            return ""
        return Path(self._log.name).read_bytes()[-size:].decode(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ control

    def call(self, method: str, path: str, body: object | None = None) -> Any:
        """One control API call; its JSON answer, or ``ControlError``."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.control_port}{path}", data=data, method=method
        )
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read()).get("error", "")
            except ValueError:
                reason = ""
            raise ControlError(exc.code, reason) from None

    def health(self) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", "/health")
        return found

    def sessions(self) -> list[dict[str, Any]]:
        """Every session the service saw, with its exit while live and its traffic."""
        found: list[dict[str, Any]] = self.call("GET", "/sessions")["sessions"]
        return found

    def session(self, session: str, country: str) -> dict[str, Any]:
        """One session's row of ``sessions`` (``""``: the requests without a session)."""
        for row in self.sessions():
            if row["session"] == session and row["country"] == country:
                return row
        raise KeyError((session, country))

    def attempts(self) -> list[dict[str, Any]]:
        """The last requests: the login as parsed (no password), the answer, the exit."""
        found: list[dict[str, Any]] = self.call("GET", "/attempts")["attempts"]
        return found

    def drop(self, session: str) -> None:
        """The service forgets ``session``: its next request leaves from a new exit."""
        self.call("POST", f"/sessions/{quote(session, safe='')}/drop", {})

    def move(self, session: str) -> list[str]:
        """The session's exit changes under it at once; its new exits."""
        found: list[str] = self.call("POST", f"/sessions/{quote(session, safe='')}/move", {})[
            "exits"
        ]
        return found

    def fail(
        self,
        status: int,
        *,
        times: int | None = 1,
        retry_after: int | None = None,
        session: str | None = None,
    ) -> None:
        """Answer ``status`` (407, 402, 429) to the next ``times`` requests (None: until
        ``clear``), of ``session`` only when given; a 429 with ``Retry-After: retry_after``."""
        body = {"status": status, "times": times, "retryAfter": retry_after, "session": session}
        self.call("POST", "/faults", body)

    def stall(self, *, times: int | None = 1, session: str | None = None) -> None:
        """Accept the next ``times`` requests and never answer them."""
        self.call("POST", "/stalls", {"times": times, "session": session})

    def clear(self) -> None:
        self.call("DELETE", "/faults")
