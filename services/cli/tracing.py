"""A trace for each one-shot command, when the environment asks for tracing.

An operator who runs ``egress-proxies apply`` or ``lease acquire`` with ``OTEL_*`` set sees one
trace from the command through what it caused: the command's span is the root, the discovery
API's server span continues it (``traceparent`` on every request, ``api_client.py``), and an
event it appends carries it to the reconciler and the executor (the store injects the current
span, docs/architecture.md, "Telemetry").

``up`` and ``run`` are services: they set tracing up themselves, one span per unit of work, and
are never wrapped in a span that would last as long as the process. A console exporter writes to
standard error here, since standard output is the command's answer (``-o json`` included).
Without tracing configured nothing is installed and the cost is one look at the environment.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence

import click
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.runtime.observability.telemetry import (
    configure_tracing,
    resolve_tracing,
    shutdown_tracing,
    tracer,
)

SERVICE_NAME = "egress-proxies-cli"
SERVICES = frozenset({"up", "run"})
"""Commands that are services: they trace themselves."""

EXPORT_TIMEOUT = 2.0
"""The longest a command waits at its end to send its spans (``OTEL_EXPORTER_OTLP_TIMEOUT``
overrides it): an unreachable collector must not hold a script up."""

_tracer = tracer("egress_proxies.cli")


def command_path(group: click.Group, args: Sequence[str]) -> list[str]:
    """The sub-command names in ``args`` (``["lease", "acquire"]``): what names the span. Only
    names of registered commands are taken, never a value a flag was given; the global options
    before them (``--log-level debug``) are passed over."""
    path: list[str] = []
    current: click.Command = group
    for arg in args:
        if not isinstance(current, click.Group):
            break
        found = current.commands.get(arg)
        if found is None:
            if path:
                break  # past the first command, anything else is that command's
            continue  # a global option or its value
        path.append(arg)
        current = found
    return path


@contextlib.contextmanager
def command_span(
    group: click.Group, args: Sequence[str], env: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Run the command inside its root span, flushed before the process exits."""
    env = os.environ if env is None else env
    path = command_path(group, args)
    if not path or path[0] in SERVICES or not resolve_tracing(SERVICE_NAME, env).enabled:
        yield
        return
    configure_tracing(
        SERVICE_NAME, env, announce=False, console=sys.stderr, export_timeout=EXPORT_TIMEOUT
    )
    try:
        with _tracer.start_as_current_span(
            " ".join(["egress-proxies", *path]),
            kind=SpanKind.CLIENT,
            attributes={"process.command": "egress-proxies", "cli.command": " ".join(path)},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield
            except click.exceptions.Exit as exc:
                _ended(span, exc.exit_code)
                raise
            except (click.ClickException, click.Abort) as exc:
                _ended(span, getattr(exc, "exit_code", 1))
                raise
            except BaseException as exc:
                span.record_exception(exc)
                _ended(span, 1)
                raise
            else:
                _ended(span, 0)
    finally:
        shutdown_tracing()  # a one-shot process: send the spans now, not in a later batch


def _ended(span: trace.Span, code: int) -> None:
    span.set_attribute("process.exit.code", code)
    if code:
        span.set_status(Status(StatusCode.ERROR, f"exit code {code}"))
