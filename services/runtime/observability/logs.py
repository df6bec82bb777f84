"""Structured logging for every service: structlog in front, stdlib ``logging`` underneath.

Both our own structlog loggers and third-party stdlib loggers (nats-py, uvicorn, the OpenTelemetry
exporters) end in one root handler with one renderer, so an operator sees a single consistent
stream, and a JSON collector never has to parse two formats.

The structlog side of the chain is the same whatever the level, format or stream: everything that
varies lives in the root handler. Reconfiguring (which tests do) therefore never leaves a logger
that was already used behind on an old set-up.

Every line, from either side, passes ``redact_secrets`` last, and tracebacks never show frame
locals: a log is read by more people than the secrets it could carry are meant for. Console lines
are also made inert (``printable``): a value from a client or from the event log must not be able
to drive the operator's terminal or forge a second line.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import traceback
from collections.abc import Mapping
from typing import TextIO

import structlog
from opentelemetry import trace
from structlog.typing import EventDict, ExcInfo, Processor, WrappedLogger

from services.runtime.pure.text import printable
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import LOG_FORMATS, LOG_LEVELS

TRACE_ID = "traceID"
SPAN_ID = "spanID"
REDACTED = "<redacted>"

# Keys whose values are secrets, compared without case, '_', '-' or '.': "Authorization",
# "nats_password", "client-secret", "x-auth-token" and "credentials_file" all match.
_SECRET_WORDS = (
    "authorization",
    "password",
    "passwd",
    "secret",
    "credential",
    "token",
    "apikey",
    "privatekey",
    "cookie",
)
# A lease's fencing token is a public, increasing counter (docs/api.md), not a credential.
_NOT_SECRET = frozenset({"fencingtoken"})
# The password of a URL's userinfo (nats://user:pass@host), and the bare userinfo of the NATS
# schemes, where nats://token@host carries the token.
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@")
_NATS_TOKEN = re.compile(r"(?i)\b((?:nats|tls|ws|wss)://)[^\s/:@]+@")
# A proxy login's user name carries a mac (docs/decisions/0133-*.md): Squid caches a checked
# login by user name, so the name is a bearer secret too. The lease id before it stays readable.
_LOGIN_MAC = re.compile(
    r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s/:@.]+)(?:\.[0-9]{1,19}){1,2}\.[0-9a-f]{32}(?=[:@])"
)
# A credential after the scheme of an Authorization header: "Bearer" as clients write it, or any
# case after "authorization:". Not prose ("a bearer token"), nor a challenge ('Bearer realm="x"').
_BEARER = re.compile(
    r"(\bBearer\s+|(?i:authorization['\"]?\s*[:=]\s*['\"]?bearer\s+))"
    r"(?![A-Za-z]+=\")[A-Za-z0-9._~+/-]+=*"
)
_MAX_DEPTH = 12


_MAYBE_SECRET = re.compile(r"://|(?i:bearer)")
"""What each of the patterns above needs: most logged text has neither, and one search is
cheaper than three substitutions (every value of every line passes here)."""


def scrub(text: str) -> str:
    """``text`` with URL passwords, proxy logins' macs, NATS tokens in URLs and bearer tokens
    replaced."""
    if not _MAYBE_SECRET.search(text):
        return text
    text = _URL_PASSWORD.sub(rf"\1{REDACTED}@", text)
    text = _NATS_TOKEN.sub(rf"\1{REDACTED}@", text)
    text = _LOGIN_MAC.sub(rf"\1.{REDACTED}", text)
    return _BEARER.sub(rf"\1{REDACTED}", text)


def is_secret_key(key: object) -> bool:
    if isinstance(key, bytes):
        key = key.decode("latin-1")
    if not isinstance(key, str):
        return False
    return _secret_name(key)


@functools.lru_cache(maxsize=4096)
def _secret_name(key: str) -> bool:
    """Cached: the same few dozen keys come on every line."""
    name = re.sub(r"[\s_.-]", "", key).lower()
    return name not in _NOT_SECRET and any(word in name for word in _SECRET_WORDS)


def _hidden(value: object) -> object:
    """An empty value says "not set", which helps and gives nothing away; anything else goes."""
    if value is None or isinstance(value, bool) or value in ("", b""):
        return value
    return REDACTED


def redact(value: object, depth: int = 0) -> object:
    """``value`` with the secrets in it replaced, however deeply nested (a copy; never mutated)."""
    if isinstance(value, str):
        return scrub(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth < _MAX_DEPTH and isinstance(value, Mapping):
        return {
            k: _hidden(v) if is_secret_key(k) else redact(v, depth + 1) for k, v in value.items()
        }
    if depth < _MAX_DEPTH and isinstance(value, list | tuple):
        if len(value) == 2 and is_secret_key(value[0]):
            # A (name, value) pair: the shape of header lists (ASGI scopes, HTTP clients).
            pair = (value[0], _hidden(value[1]))
            return pair if isinstance(value, tuple) else list(pair)
        items = [redact(item, depth + 1) for item in value]
        return tuple(items) if isinstance(value, tuple) else items
    # Anything else is shown by its repr; replace it only when that repr carries a secret.
    try:
        shown = repr(value)
    except Exception:  # a broken __repr__ is the renderer's to report, as it was before
        return value
    cleaned = scrub(shown)
    return value if cleaned == shown else cleaned


def redact_secrets(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """The last step before rendering, for structlog and stdlib lines alike: values of secret-named
    keys, and secrets inside any text (URLs, ``Bearer`` headers), never reach the output."""
    return {
        key: value
        if key == "exc_info"  # rendered later; its text is scrubbed by the renderers
        else (_hidden(value) if is_secret_key(key) else redact(value))
        for key, value in event_dict.items()
    }


_LAID_OUT = frozenset({"stack", "exception"})


class _Shown(str):
    """A value made printable for the console renderer, which writes a string either bare or as
    its ``repr`` (when it holds spaces or quotes). Bare, it is the printable text; as a ``repr``,
    that of the original, which escapes by itself (the printable text's would escape twice)."""

    original: str

    def __repr__(self) -> str:
        return repr(self.original)


def _shown(value: str) -> str:
    shown = _Shown(printable(value))
    shown.original = value
    return shown


def inert_for_terminal(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Console lines only (JSON escapes by itself): no logged string can drive the terminal, or
    start what looks like a line of its own."""
    return {
        printable(key) if isinstance(key, str) else key: (
            value
            if not isinstance(value, str)
            else printable(value, multiline=True)
            if key in _LAID_OUT
            else _shown(value)
        )
        for key, value in event_dict.items()
    }


def plain_traceback(sio: TextIO, exc_info: ExcInfo) -> None:
    """The console's tracebacks: plain text, without frame locals, scrubbed and made printable.

    Rich's tracebacks show every frame's locals (request headers with their bearer token among
    them), and wrap long lines at the console width, which would split a URL past ``scrub``.
    """
    text = "".join(traceback.format_exception(*exc_info))
    sio.write("\n" + printable(scrub(text), multiline=True))


def add_trace_ids(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Tie a line to the span it was written in (docs/architecture.md, Telemetry), so logs and
    traces join up.

    The ids of the current span replace any the caller bound: a line must point at the span it was
    written in, and one key per id is what keeps them from appearing twice. Outside a valid span
    the line is left alone, ids a caller bound included.
    """
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event_dict[TRACE_ID] = format(context.trace_id, "032x")
        event_dict[SPAN_ID] = format(context.span_id, "016x")
    return event_dict


def _shared_processors() -> list[Processor]:
    """Run for structlog lines and, as the pre-chain, for lines from stdlib loggers alike."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_trace_ids,
        structlog.processors.StackInfoRenderer(),
    ]


class _RootHandler(logging.StreamHandler[TextIO]):
    """Marks the handler this module installed, so configuring again replaces it, not adds one."""


def configure_logging(
    level: str = "info", fmt: str = "console", stream: TextIO | None = None
) -> None:
    """Route structlog and stdlib logging to ``stream`` (standard error unless given).

    ``stream`` is looked up when called, not when imported, so a redirected ``sys.stderr`` (a test
    capturing output, a daemon that reopened it) is honoured.
    """
    level, fmt = level.lower(), fmt.lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log-level / LOG_LEVEL: {level!r}; use one of {', '.join(LOG_LEVELS)}")
    if fmt not in LOG_FORMATS:
        raise ConfigError(
            f"--log-format / LOG_FORMAT: {fmt!r}; use one of {', '.join(LOG_FORMATS)}"
        )
    out = sys.stderr if stream is None else stream

    renderer: list[Processor]
    if fmt == "json":
        # The traceback becomes text first, so redaction sees it. JSON escapes control characters.
        renderer = [
            structlog.processors.format_exc_info,
            redact_secrets,
            structlog.processors.JSONRenderer(),
        ]
    else:
        # The console renderer formats exceptions itself and objects to format_exc_info before it.
        renderer = [
            redact_secrets,
            inert_for_terminal,
            structlog.dev.ConsoleRenderer(colors=out.isatty(), exception_formatter=plain_traceback),
        ]
    handler = _RootHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_shared_processors(),
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _RootHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: structlog.testing.capture_logs swaps the chain, and a cached logger would
        # bypass it. A log call costs one extra bind, which this system's log volume never notices.
        cache_logger_on_first_use=False,
    )


def reset_logging() -> None:
    """Back to structlog's defaults, which print each line to ``sys.stdout`` as it is at that
    moment, with our root handler removed: for tests, whose captures come and go while a stream
    given to ``configure_logging`` stays where it was."""
    structlog.reset_defaults()
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _RootHandler)]:
        root.removeHandler(old)
        old.close()
