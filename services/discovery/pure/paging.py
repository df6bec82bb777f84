"""Listings that page as Kubernetes lists do: a ``limit`` and an opaque ``continue`` token.

A token holds the key of the last row returned, not an offset, so a row added or removed
between two pages shifts nothing: the next page starts after that key in the listing's stable
order, whatever changed before it. It also holds a digest of the listing and its filters, so a
token is refused by a listing it was not made for rather than answering the wrong rows. The
token is base64url of a version byte and a small JSON array; clients must treat it as opaque.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TypeVar

MAX_LIMIT = 1000
"""The largest page a client may ask for: a page of full proxies is then about 1.5 MB."""
TOKEN_VERSION = 1
MAX_TOKEN = 4096
"""A token longer than this was not made here (ours are a few hundred bytes)."""
RESTART = "start the listing again without continue"

K = TypeVar("K")
Key = tuple[str, ...]


class BadLimit(ValueError):
    """``limit`` is not a whole number from 1 to ``MAX_LIMIT``; the message says so."""


class BadToken(ValueError):
    """A ``continue`` token that does not decode or was made for another listing."""


def parse_limit(text: str | None) -> int | None:
    """``limit`` as sent; None when absent (the whole listing, as Kubernetes answers)."""
    if text is None:
        return None
    value = text.strip()
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise BadLimit(
            f"limit: {text[:40]!r} is not a whole number from 1 to {MAX_LIMIT}; send "
            f"limit=500, say, and follow continue for the next page"
        )
    return int(value)


def scope(listing: str, filters: Iterable[tuple[str, str]]) -> str:
    """A digest of the listing and its filters, in any order: what a token is valid for."""
    canonical = json.dumps([listing, sorted(filters)], ensure_ascii=True, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def encode_token(where: str, key: Key) -> str:
    body = json.dumps([where, list(key)], ensure_ascii=True, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(bytes([TOKEN_VERSION]) + body).rstrip(b"=").decode()


def decode_token(token: str, where: str, width: int) -> Key:
    """The key a token continues after, if it was made for ``where`` with ``width`` parts."""
    fix = f"continue: {token[:40]!r} is not a token of this listing and its filters; {RESTART}"
    if len(token) > MAX_TOKEN or not token.isascii():
        raise BadToken(fix)
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        if not raw or raw[0] != TOKEN_VERSION:
            raise BadToken(fix)
        made_for, key = json.loads(raw[1:])
    except (binascii.Error, ValueError, TypeError, RecursionError):
        # RecursionError: JSON nested deeper than the parser goes (a hostile token).
        raise BadToken(fix) from None
    if made_for != where or not isinstance(key, list) or len(key) != width:
        raise BadToken(fix)
    if not all(isinstance(part, str) for part in key):
        raise BadToken(fix)
    return tuple(key)


def start_after(keys: Sequence[Key], after: Key | None) -> int:
    """Where a page starts in ``keys`` (sorted): just past ``after``, present or not."""
    return 0 if after is None else bisect_right(keys, after)


DENSE = 8
"""Matches at least one in this many of the listing: a page is found by walking the order from
the token's key (about ``DENSE`` keys per row shown) rather than by sorting every match."""


def page_of(
    keys: Sequence[Key],
    found: AbstractSet[str],
    key_of: Mapping[str, Key],
    after: Key | None,
    limit: int | None,
) -> tuple[list[Key], bool]:
    """The page after ``after`` of the keys (sorted, uid last) whose uid is in ``found``, and
    whether more follow: in time proportional to the page when matches are dense, to the
    matches when they are sparse, never to the listing."""
    if limit is not None and len(found) * DENSE >= len(keys):
        shown: list[Key] = []
        for i in range(start_after(keys, after), len(keys)):
            key = keys[i]
            if key[-1] in found:
                shown.append(key)
                if len(shown) > limit:
                    break
        return shown[:limit], len(shown) > limit
    matched = sorted(key_of[uid] for uid in found)
    start = start_after(matched, after)
    end = len(matched) if limit is None else start + limit
    page = matched[start:end]
    return page, end < len(matched) and bool(page)
