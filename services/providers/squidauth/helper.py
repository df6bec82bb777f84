#!/usr/bin/env python3
"""Squid's basic-authentication helper for leases: one self-contained file, standard library only.

Squid starts it (``auth_param basic program``) and writes one line per credential to check:
``[channel] user password [extras]``, user and password URL-encoded; the helper answers
``[channel] OK`` or ``[channel] ERR message="..."`` (``BH`` when it cannot decide at all). A
lease's ``OK`` names it, ``OK lease=<lease id>``: Squid keeps the pair as a note of every request
the credential makes, and an upstream proxy's access log writes it, so its bytes are metered to
the lease (docs/decisions/0161-metering-upstream-bytes.md). The probe's gets no note. With
``concurrency=N`` in squid.conf every line starts with a channel id, which ``--concurrent`` tells
the helper to expect and echo.

It runs on the proxy, which may have no route to NATS: everything it decides comes from the
credential itself (docs/decisions/0084-leases-enforced-at-the-proxy.md). A lease's user name is
``<lease id>.<token>.<expiry ms>.<mac>`` and its password ``<token>.<expiry ms>.<mac>``, the
second mac over the whole user name (docs/decisions/0133-a-proxy-login-nobody-else-can-repeat.md):
Squid caches a checked credential by user name alone, and a user name only its holder knows is an
entry nobody else can land on. A credential is accepted when its password's mac, which covers
the whole user name, verifies with this proxy's key (``--key-file``), its expiry has not passed on
this host's clock, and its fencing token is not lower than the highest token accepted so far.
That highest token is kept in ``--state-file`` under an exclusive lock, so the several helper
processes Squid runs agree, and a restarted helper (or Squid) keeps refusing an older lease;
``--fence-floor`` is where a new instance of the proxy starts (the proxy's highest granted token
when it was created, D92). The probe's user name, ``egress-probe.<expiry ms>.<mac>``, is checked
like a lease's but never fences and is never fenced.

Whoever reaches the proxy port chooses what Squid hands the helper, and Squid gives up when its
helpers keep dying (D92): so no input ends this process. Lines are read as bytes and bounded
(``MAX_LINE``), numbers are ASCII digits only, a credential that is not printable ASCII is
refused before any comparison, and whatever still goes wrong on one line is answered ``BH``
on that line's channel while the loop goes on. Refusals are logged to stderr (Squid's
cache.log) with the lease id part of the user name and the token, never a mac, and at most
``LOG_BURST`` lines a minute.

The same scheme is minted by ``services/providers/squidauth/pure/scheme.py``; this copy stands alone
because it is shipped to VMs and pods as a single file.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import hmac
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO
from urllib.parse import unquote_to_bytes

PROBE_USER = "egress-probe"
PROBE_NAME = PROBE_USER.encode()
MAC_HEX = 32
MAX_LINE = 65536
"""Bytes of one request line; Squid's own buffer for ``user password`` is 8 KiB. A longer line is
answered ERR and the rest of it read and dropped."""
MAX_FIELD = 512
"""Characters of a user or password, decoded; a real one has fewer than 100."""
MAX_DIGITS = 19
"""Digits of a token or an expiry: every such number fits in 63 bits."""
LOG_BURST = 20
"""Refusals logged per minute; the rest are counted and the count logged with the next one."""
DIGITS = frozenset("0123456789")
NOTE_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
"""What a lease id in a note may hold (``services/providers/pure/meterlog.py`` reads the same):
one word no note or log format quotes; a lease id with anything else gets a plain ``OK``."""
MAX_NOTE = 128
MALFORMED = 'ERR message="malformed credential"'
MALFORMED_LEASE = (
    'ERR message="malformed lease credential: expected user <lease id>.<token>.<expiry>.<mac>"'
)
NOT_VALID = 'ERR message="credential not valid for this proxy"'


@functools.lru_cache(maxsize=4)
def _keyed(key: bytes) -> hmac.HMAC:
    """An HMAC already keyed: each mac copies it rather than hashing the key's pads again, a
    sixth of a refusal's cost (bench.helper_auth, D133). A helper has one key."""
    return hmac.new(key, digestmod=hashlib.sha256)


def _mac(key: bytes, message: str) -> str:
    keyed = _keyed(key).copy()
    keyed.update(message.encode())
    return keyed.hexdigest()[:MAC_HEX]


def _number(text: str) -> int | None:
    """A non-negative number written in ASCII digits, else None (``str.isdigit`` also takes
    digits such as ``²``, which ``int`` refuses)."""
    if not 0 < len(text) <= MAX_DIGITS or not DIGITS.issuperset(text):
        return None
    return int(text)


class Fence:
    """The highest fencing token accepted on this proxy, shared through a locked file; never
    lower than ``floor``.

    With ``keep_open`` (the helper process, which checks for as long as Squid keeps it) the file
    stays open between checks and only the lock is taken and dropped: opening it again on every
    check cost a third of the helper's time per check (bench.helper_auth, D133). The file is
    only ever rewritten in place, never replaced, so the open one is the one every helper uses."""

    def __init__(self, path: str, floor: int = 0, *, keep_open: bool = False) -> None:
        self.path = path
        self.floor = floor
        self._keep_open = keep_open
        self._fd: int | None = None

    def admit(self, token: int) -> bool:
        """Whether ``token`` may pass; records it when it is the new highest."""
        fd = self._fd
        if fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._fd = None  # until this check has gone well: a file that failed us is reopened
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            admitted = self._admit(fd, token)
            if self._keep_open:
                fcntl.flock(fd, fcntl.LOCK_UN)
                self._fd = fd
            return admitted
        finally:
            if self._fd is None:
                os.close(fd)  # which drops the lock too

    def _admit(self, fd: int, token: int) -> bool:
        stored = _number(os.pread(fd, 32, 0).decode("ascii", "replace").strip()) or 0
        if token < max(stored, self.floor):
            return False
        if token > stored:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{token}\n".encode(), 0)
            os.fsync(fd)
        return True


def noted(user: str, verdict: str) -> str:
    """``verdict``, and when it admits a lease's credential, the lease id as Squid's note
    ``lease``. A probe's or an id no note can carry as one word stays ``OK``."""
    if verdict != "OK":
        return verdict
    parts = user.rsplit(".", 3)
    lease_id = parts[0]
    if len(parts) != 4 or not 0 < len(lease_id) <= MAX_NOTE:
        return verdict
    if not NOTE_CHARACTERS.issuperset(lease_id):
        return verdict
    return f"OK lease={lease_id}"


def _plain(text: str) -> bool:
    return len(text) <= MAX_FIELD and text.isascii() and text.isprintable()


def check(key: bytes, fence: Fence, user: str, password: str, now_ms: int) -> str:
    """``OK``, or ``ERR`` with the reason Squid logs. Total: any strings get an answer.

    One mac is computed, the password's: it is over the whole user name, the user name's own mac
    included, so a user name that was not minted with this key can only come with a password
    nobody without the key can make. The user name's mac is there to be unguessable (it is what
    Squid caches a check under, D133), not to be checked twice."""
    if not _plain(user) or not _plain(password) or "|" in user:
        return MALFORMED
    parts = user.rsplit(".", 3)
    token: int | None = None
    if len(parts) == 3 and parts[0] == PROBE_USER:
        expiry, name_mac = parts[1], parts[2]
        clear, message = expiry, f"probe|{user}|{expiry}"
    elif len(parts) == 4 and parts[0]:
        number, expiry, name_mac = parts[1], parts[2], parts[3]
        token = _number(number)
        if token is None:
            return MALFORMED_LEASE
        clear, message = f"{number}.{expiry}", f"lease|{user}|{number}|{expiry}"
    else:
        return MALFORMED_LEASE
    expires = _number(expiry)
    if expires is None or len(name_mac) != MAC_HEX:
        return NOT_VALID
    given_clear, _, mac = password.rpartition(".")
    if given_clear != clear or not hmac.compare_digest(_mac(key, message), mac):
        return NOT_VALID
    if now_ms >= expires:
        return 'ERR message="lease expired"'
    if token is not None and not fence.admit(token):
        return 'ERR message="fenced: a newer lease is in use"'
    return "OK"


class Log:
    """Refusals to stderr (cache.log), ``LOG_BURST`` a minute at most: a flood of bad requests
    must not fill the proxy's disk."""

    def __init__(self, write: Callable[[str], object] | None = None) -> None:
        self._write = write or _stderr
        self._window = 0.0
        self._logged = 0
        self._dropped = 0

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if now - self._window >= 60.0:
            self._window, self._logged = now, 0
        if self._logged >= LOG_BURST:
            self._dropped += 1
            return
        self._logged += 1
        dropped, self._dropped = self._dropped, 0
        more = f" ({dropped} more refusals not logged)" if dropped else ""
        self._write(f"egress lease helper: {text}{more}")


def _stderr(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # nowhere to log: answering matters more
        print(text, file=sys.stderr, flush=True)


def _shown(raw: bytes) -> str:
    """A user name as a log may show it: printable ASCII, short, one line."""
    text = raw[:64].decode("ascii", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _described(user: bytes) -> str:
    """What a log line says of a refused credential: the lease id part of the user name and the
    token, which are no secret, never a mac (the user name's or the password's)."""
    lease_id, _, rest = user.partition(b".")
    if lease_id == PROBE_NAME:
        return f"user={PROBE_USER!r}"
    token = rest.partition(b".")[0]
    shown = token.decode("ascii") if token.isdigit() and len(token) <= MAX_DIGITS else "?"
    return f"lease={_shown(lease_id)!r} token={shown}"


def answer(
    key: bytes | None,
    fence: Fence,
    line: bytes | str,
    *,
    concurrent: bool,
    too_long: bool = False,
    log: Callable[[str], None] = _stderr,
) -> str:
    """The answer line to one request line (without its newline), whatever it holds: the
    channel it came with (``--concurrent``), then OK, ERR or BH. Never raises."""
    raw = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
    words = raw.split()
    channel = ""
    if concurrent and words:
        # Bytes without ASCII white space, decoded one to one: echoed exactly as Squid sent it.
        channel, words = words[0].decode("latin-1") + " ", words[1:]
    try:
        verdict = _verdict(key, fence, words, too_long, log)
    except Exception as exc:  # one bad line must not end the helper (D92)
        log(f"internal error on a request ({type(exc).__name__}), answered BH")
        verdict = 'BH message="internal error in the lease helper, see cache.log"'
    return channel + verdict


def _unquoted(word: bytes) -> bytes:
    """A field as Squid URL-encoded it, decoded; a minted credential has nothing to decode
    (its characters are URL-safe), and skipping the call is a tenth of a check (D133)."""
    return unquote_to_bytes(word) if b"%" in word else word


def _verdict(
    key: bytes | None, fence: Fence, words: list[bytes], too_long: bool, log: Callable[[str], None]
) -> str:
    if too_long:
        log(f"refused a request line longer than {MAX_LINE} bytes")
        return 'ERR message="request line too long"'
    if len(words) < 2:
        log("refused a request without user and password")
        return 'ERR message="expected: user password"'
    if key is None:
        return 'BH message="no proxy key: see the helper\'s messages in cache.log"'
    user, password = _unquoted(words[0]), _unquoted(words[1])
    try:
        text_user, text_password = user.decode("ascii"), password.decode("ascii")
    except UnicodeDecodeError:
        verdict = MALFORMED
    else:
        try:
            now_ms = time.time_ns() // 10**6
            verdict = noted(text_user, check(key, fence, text_user, text_password, now_ms))
        except OSError as exc:
            log(f"cannot read or write the fencing state {fence.path}: {exc.strerror or exc}")
            return 'BH message="fencing state unusable, see cache.log"'
    if verdict != "OK":
        log(f"refused {_described(user)}: {verdict.partition(' ')[2]}")
    return verdict


def read_lines(stream: BinaryIO, limit: int = MAX_LINE) -> Iterator[tuple[bytes, bool]]:
    """Each line without its end, and whether it was longer than ``limit`` (then its first
    ``limit`` bytes; the rest is read and dropped, never held)."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1], False
            continue
        if len(line) <= limit:
            yield line, False  # the last line, without an end
            return
        while True:
            rest = stream.readline(limit)
            if not rest or rest.endswith(b"\n"):
                break
        yield line[:limit], True


def serve(
    stdin: BinaryIO,
    stdout: BinaryIO,
    key: bytes | None,
    fence: Fence,
    *,
    concurrent: bool,
    limit: int = MAX_LINE,
    log: Callable[[str], None] | None = None,
) -> None:
    """Answer every line of ``stdin`` until it ends. A blank line has no channel to answer on
    (Squid never sends one), so it gets no answer."""
    log = log or Log()
    for line, too_long in read_lines(stdin, limit):
        if not too_long and not line.strip():
            continue
        reply = answer(key, fence, line, concurrent=concurrent, too_long=too_long, log=log)
        stdout.write(reply.encode("latin-1", "replace") + b"\n")
        stdout.flush()


def read_key(path: str) -> bytes | None:
    try:
        with open(path, encoding="ascii") as file:
            return bytes.fromhex(file.read().strip())
    except (OSError, ValueError) as exc:
        # Squid copies a helper's stderr into cache.log; answering BH keeps Squid up, where
        # exiting would make it respawn the helper until it gives up.
        print(f"egress lease helper: cannot read the proxy key {path}: {exc}", file=sys.stderr)
        return None


def _floor(text: str) -> int:
    value = _number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r}: give a fencing token in digits, e.g. 0")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Squid basic-auth helper for egress leases")
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--state-file", required=True)
    parser.add_argument("--fence-floor", type=_floor, default=0)
    parser.add_argument("--concurrent", action="store_true")
    parser.add_argument("--instance", default="", help="ignored: names the instance in ps")
    args = parser.parse_args(argv)
    key = read_key(args.key_file)
    fence = Fence(args.state_file, args.fence_floor, keep_open=True)
    # Squid closing our output means it is stopping or replacing us: not an error.
    with contextlib.suppress(BrokenPipeError):
        serve(sys.stdin.buffer, sys.stdout.buffer, key, fence, concurrent=args.concurrent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
