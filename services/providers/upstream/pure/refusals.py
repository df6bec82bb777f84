"""A proxy service's answers onto the error taxonomy (services/providers/base.py): a pure table,
tested row by row (docs/decisions/0160-upstream-proxy-services.md).

The input is what a request through the service's gateway came back with: the HTTP status
(0 when none came: refused, reset, timed out), its ``Retry-After`` header and the start of its
body. A 407 is the account refused (a wrong password or user name): nothing will change until
someone fixes the entry, so it is Permanent and names the entry. A 402, or a refusal whose body
says the traffic or the balance is spent, is QuotaExceeded: retry slowly, say why. A 429 is the
service throttling: Transient, after the delay it asked for (bounded by ``MAX_RETRY_AFTER``,
a broken or hostile header read as none). Anything the service or the way to it can recover
from by itself (5xx, no answer) is Transient; any other 4xx is the request refused for good.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime

from services.providers.base import (
    MAX_RETRY_AFTER,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)

_QUOTA = re.compile(
    r"(quota|traffic limit|bandwidth limit|out of traffic|insufficient (balance|funds|traffic)"
    r"|balance is (empty|exhausted)|no traffic left|payment required|limit (reached|exceeded))",
    re.IGNORECASE,
)
BODY_READ = 2048
"""Bytes of a refusal's body read for its reason: a service says it in a sentence."""
# 408 timeout, 425 too early: asking again later may work.
_TRANSIENT_4XX = frozenset({408, 425})


@dataclass(frozen=True, slots=True)
class Answer:
    """What came back from the service: ``status`` 0 when nothing did; ``retry_after`` the
    header's text; ``body`` at most ``BODY_READ`` characters of it."""

    status: int
    retry_after: str = ""
    body: str = ""


def retry_after_seconds(text: str, now: datetime) -> float:
    """``Retry-After`` as seconds from ``now``: a number, or an HTTP date; 0 for anything else
    (negative, non-finite, unparsable), at most ``MAX_RETRY_AFTER``."""
    text = text.strip()
    if not text or len(text) > 64:
        return 0.0
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return 0.0
        if when.tzinfo is None or now.tzinfo is None:
            return 0.0
        seconds = (when - now).total_seconds()
    if not math.isfinite(seconds) or seconds <= 0:
        return 0.0
    return min(seconds, MAX_RETRY_AFTER)


def refusal(answer: Answer, *, entry: str, now: datetime) -> ProviderError | None:
    """The error for ``answer`` from the service of provider entry ``entry``; None when the
    service let the request through (2xx, 3xx). The message says what an operator does."""
    status, body = answer.status, answer.body[:BODY_READ]
    where = f"provider {entry}: the proxy service"
    if 200 <= status < 400:
        return None
    if status == 407:
        return Permanent(
            f"{where} refused the account (HTTP 407): check {entry}'s account, zone and "
            "password (passwordFile or passwordEnv) and the template against the service's "
            "dashboard"
        )
    if status == 402 or (400 <= status < 500 and _QUOTA.search(body)):
        return QuotaExceeded(
            f"{where} says the account's traffic or balance is spent (HTTP {status}): top it "
            "up or raise its limit at the service"
        )
    if status == 429:
        wait = retry_after_seconds(answer.retry_after, now)
        said = f"; it asked for {wait:g} s" if wait else ""
        return Transient(f"{where} is throttling (HTTP 429){said}", retry_after=wait)
    if status == 0:
        return Transient(f"{where} did not answer (refused, reset or timed out)")
    if 500 <= status < 600 or status in _TRANSIENT_4XX:
        wait = retry_after_seconds(answer.retry_after, now)
        return Transient(f"{where} failed (HTTP {status})", retry_after=wait)
    if 400 <= status < 500:
        return Permanent(
            f"{where} refused the request (HTTP {status}): check {entry}'s template and "
            "allowedCountries against what the service's plan allows"
        )
    # 1xx, or a status no HTTP server sends: something in between misbehaved.
    return Transient(f"{where} answered a status no proxy sends ({status})")
