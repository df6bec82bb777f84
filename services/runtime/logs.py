"""Structured logging for every service: structlog in front, stdlib ``logging`` underneath.

Both our own structlog loggers and third-party stdlib loggers (nats-py, uvicorn, the OpenTelemetry
exporters) end in one root handler with one renderer, so an operator sees a single consistent
stream, and a JSON collector never has to parse two formats.

The structlog side of the chain is the same whatever the level, format or stream: everything that
varies lives in the root handler. Reconfiguring (which tests do) therefore never leaves a logger
that was already used behind on an old set-up.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from opentelemetry import trace
from structlog.typing import EventDict, Processor, WrappedLogger

from services.runtime.config import LOG_FORMATS, LOG_LEVELS, ConfigError

TRACE_ID = "traceID"
SPAN_ID = "spanID"


def add_trace_ids(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Tie a line to the span it was written in (DESIGN §6), so logs and traces join up.

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
        renderer = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        # The console renderer formats exceptions itself and objects to format_exc_info before it.
        renderer = [structlog.dev.ConsoleRenderer(colors=out.isatty())]
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
