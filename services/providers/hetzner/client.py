"""The real Hetzner Cloud client (``hcloud``, synchronous, on ``requests``), its token, and the
translation of its exceptions into the taxonomy.

The token is ``HCLOUD_TOKEN`` or the file ``tokenFile`` names, read when a client is built (in
a worker thread: a file read is I/O, constructors do none) and again after Hetzner refused it,
so a rotated Secret is picked up without a restart. It goes into the client's Authorization
header and nowhere else: no log line, exception text or repr of ours carries it.

hcloud retries some answers itself (429, 502, 504, ``conflict``, ``timeout``, network
timeouts: up to 5 times, sleeping up to a minute): the executor owns retrying, so every client
made here has that turned off, and one call is one request. hcloud's exception carries the
error code and message but not the HTTP response, so a response hook keeps the last status and
headers of the calling thread: the throttle's ``RateLimit-Reset`` is read from there.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import requests
from hcloud import APIException, Client

from services.providers.base import Permanent, ProviderError, Transient
from services.providers.hetzner.config import HetznerConfig
from services.providers.hetzner.pure.classify import classify, retry_after

HCLOUD_RANGE = ">=2.18,<3"
"""The hcloud versions this module is written for, as pyproject's ``hetzner`` extra pins them:
2.18 brought a server type's per-location ``available``; ``build_client`` reaches into private
attributes every 2.x since 2.12 has (``_client_hetzner``, ``_retry_max_retries``,
``_session``), and tests/integration/test_hetzner_hcloud.py checks them on the installed one."""
TOKEN_ENV = "HCLOUD_TOKEN"
REDACTED = "<redacted>"
MAX_TOKEN_FILE = 4096
# Printable ASCII without spaces: anything else would make requests refuse the header, and its
# error message would show the header's value.
_TOKEN = re.compile(r"^[\x21-\x7e]{1,512}\Z")
_NO_TOKEN = (
    "no Hetzner Cloud API token: set HCLOUD_TOKEN in the environment of the executor and the "
    "gc (a read & write token of the project), or tokenFile in the providers config (a file "
    "holding it, e.g. a mounted Secret)"
)


class _LastAnswer(threading.local):
    """The last HTTP answer this thread saw: each call runs in one worker thread, start to end."""

    status: int | None = None
    headers: dict[str, str] | None = None


last_answer = _LastAnswer()


def _remember(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    last_answer.status = response.status_code
    last_answer.headers = dict(response.headers)


def forget_last_answer() -> None:
    last_answer.status = None
    last_answer.headers = None


def read_token(config: HetznerConfig) -> str:
    """The API token, or Permanent saying where it was looked for (never what was found)."""
    if config.token_file:
        source = f"tokenFile {config.token_file}"
        try:
            with Path(config.token_file).open("rb") as file:
                raw = file.read(MAX_TOKEN_FILE + 1)
        except OSError as exc:
            raise Permanent(
                f"{source}: cannot read it ({exc.strerror or type(exc).__name__})"
            ) from exc
        if len(raw) > MAX_TOKEN_FILE:
            raise Permanent(f"{source}: larger than any API token; point it at the token file")
        text = raw.decode("utf-8", "replace")
    else:
        source = TOKEN_ENV
        text = os.environ.get(TOKEN_ENV, "")
        if not text.strip():
            raise Permanent(_NO_TOKEN)
    token = text.strip()
    if not _TOKEN.match(token):
        raise Permanent(
            f"the token in {source} is empty or has characters no API token has (not shown): "
            "put the token alone in it, as the Cloud Console shows it"
        )
    return token


def build_client(config: HetznerConfig) -> Client:
    """A client for ``config`` with hcloud's own retries off. Blocking (reads the token)."""
    client = Client(
        token=read_token(config),
        api_endpoint=config.api_endpoint,
        application_name="egress-proxies",
        timeout=config.timeout_seconds,
    )
    # hcloud offers no option for these: its retry counter and its session are the one place
    # every request passes (a version without them fails loudly here, not silently retrying).
    for base in (client._client, client._client_hetzner):
        if not hasattr(base, "_retry_max_retries"):
            raise RuntimeError(
                f"this hcloud version has no _retry_max_retries; install hcloud{HCLOUD_RANGE}"
            )
        base._retry_max_retries = 0
        base._session.hooks["response"].append(_remember)
    return client


def close_client(client: Client) -> None:
    for base in (client._client, client._client_hetzner):
        base._session.close()


def api_error(exc: APIException, *, op: str, what: str) -> ProviderError:
    """``exc`` as a taxonomy error with Hetzner's code and message, and the delay it asked
    for; the answer's status and headers are this thread's last (see the module docstring)."""
    status = last_answer.status
    headers = last_answer.headers or {}
    cls = classify(exc.code, status, op=op)
    delay = retry_after(headers, time.time(), code=exc.code, status=status)
    shown = f"HTTP {status} " if status is not None else ""
    return cls(f"{what}: {shown}{exc.code}: {exc.message}{_fields(exc.details)}", retry_after=delay)


def _fields(details: object) -> str:
    """``invalid_input`` names the fields it refused; other details (a non-JSON body) are not
    shown."""
    if not isinstance(details, dict) or not isinstance(details.get("fields"), list):
        return ""
    parts = []
    for field in details["fields"][:8]:
        if isinstance(field, dict):
            messages = field.get("messages")
            text = "; ".join(str(m) for m in messages) if isinstance(messages, list) else ""
            parts.append(f"{field.get('name', '?')}: {text}".rstrip(": "))
    return f" ({', '.join(parts)})" if parts else ""


def token_of(client: Client) -> str:
    return str(client._client._token)


def scrub(exc: BaseException, secret: str) -> None:
    """Take ``secret`` out of ``exc``'s text in place: an answer that echoes the token (an
    endpoint's error page, a proxy in between) must not carry it into our error nor into the
    client's chained one, and both are logged."""
    if not secret:
        return
    exc.args = tuple(a.replace(secret, REDACTED) if isinstance(a, str) else a for a in exc.args)
    if isinstance(exc, APIException):
        exc.message = str(exc.message).replace(secret, REDACTED)
        exc.details = None if secret in repr(exc.details) else exc.details


def translate(exc: Exception, *, op: str, what: str) -> ProviderError | None:
    """``exc`` as a taxonomy error saying what failed, or None for an exception that is not the
    client's (a bug, which the instrumentation layer reports as such)."""
    if isinstance(exc, requests.exceptions.InvalidHeader):
        # Its text would show the header: the token. read_token refuses such tokens first.
        return Permanent(f"{what}: the API token cannot be sent as a header (not shown)")
    if isinstance(exc, APIException):
        return api_error(exc, op=op, what=what)
    if isinstance(exc, requests.Timeout | TimeoutError):
        return Transient(f"{what}: timed out: {exc}")
    if isinstance(exc, requests.exceptions.InvalidURL | requests.exceptions.InvalidSchema):
        return Permanent(f"{what}: the API URL is not usable: {exc}")
    if isinstance(exc, requests.RequestException | OSError):
        return Transient(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, TypeError | KeyError | AttributeError | ValueError) and _in_client(exc):
        # hcloud read an answer of a shape Hetzner never sends (a wrong endpointUrl, a proxy's
        # page): not a bug of ours, and it may pass.
        return Transient(f"{what}: the answer is not Hetzner's API ({type(exc).__name__})")
    return None


def _in_client(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside the hcloud package (our own code's are bugs)."""
    tb = exc.__traceback__
    last = ""
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return f"{os.sep}hcloud{os.sep}" in last
