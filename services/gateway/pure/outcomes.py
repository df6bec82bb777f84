"""What a response says about the proxy it came through, and whether to try another
(docs/gateway.md, "Outcomes").

The gateway sees what a library-less crawler cannot report: the status of every plain HTTP
response, and whether a tunnel opened. A status the operator counts as a block (403 and 429 by
default) is reported ``blocked`` for the target host, and an idempotent request is sent once more
through another proxy, so the crawler sees the second answer. An error Squid made itself
(``X-Squid-Error``: the site did not answer, refused, timed out) is ``failed``: the proxy's
fault or the site's, not the site's view of the address.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

Outcome = Literal["success", "blocked", "failed"]

DEFAULT_BLOCK_CODES = (403, 429)
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
"""RFC 9110's idempotent methods: sending one twice means what sending it once does."""
MAX_RETRY_BODY = 64 * 1024
"""A request body kept for a retry; a larger one is streamed and its request not retried."""


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    retry: bool
    """Send the request again through another proxy, instead of answering this response."""


SUCCESS = Verdict("success", retry=False)
"""Most answers' verdict, made once: a frozen dataclass costs microseconds to make."""


def judge(
    status: int,
    squid_error: bool,
    method: str,
    *,
    block_codes: Collection[int] = DEFAULT_BLOCK_CODES,
    attempt: int = 0,
    replayable: bool = True,
    sticky: bool = False,
) -> Verdict:
    """``attempt`` counts the sends before this one; a request is retried at most once.
    ``replayable``: its whole body is kept. ``sticky``: it belongs to a session, whose
    contract is one proxy, so it is reported but never moved."""
    if squid_error:
        outcome: Outcome = "failed"
    elif status in block_codes:
        outcome = "blocked"
    else:
        return SUCCESS
    retry = attempt == 0 and replayable and not sticky and method in IDEMPOTENT
    return Verdict(outcome, retry=retry)


def parse_block_codes(text: str) -> tuple[int, ...]:
    """``--block-codes`` (``403,429``): HTTP statuses from 400 to 599, comma-separated."""
    codes: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        if not part.isascii() or not part.isdigit() or not 400 <= int(part) <= 599:
            raise ValueError(
                f"--block-codes: {part!r} is not an HTTP status from 400 to 599 (e.g. 403,429)"
            )
        codes.append(int(part))
    return tuple(sorted(set(codes)))
