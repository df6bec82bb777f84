#!/usr/bin/env python3
"""Squid's basic-authentication helper for leases: one self-contained file, standard library only.

Squid starts it (``auth_param basic program``) and writes one line per credential to check:
``[channel] user password [extras]``, user and password URL-encoded; the helper answers
``[channel] OK`` or ``[channel] ERR message="..."`` (``BH`` when it cannot decide at all). With
``concurrency=N`` in squid.conf every line starts with a channel id, which ``--concurrent`` tells
the helper to expect and echo.

It runs on the proxy, which may have no route to NATS: everything it decides comes from the
credential itself (docs/decisions.md, D84). A credential is accepted when its mac verifies with
this proxy's key (``--key-file``), its expiry has not passed on this host's clock, and its
fencing token is not lower than the highest token accepted so far. That highest token is kept in
``--state-file`` under an exclusive lock, so the several helper processes Squid runs agree, and a
restarted helper (or Squid) keeps refusing an older lease. The probe user is checked like a
lease but never fences and is never fenced.

The same scheme is minted by ``services/providers/squidauth/scheme.py``; this copy stands alone
because it is shipped to VMs and pods as a single file.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import hmac
import os
import sys
import time
from urllib.parse import unquote

PROBE_USER = "egress-probe"
MAC_HEX = 32


def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()[:MAC_HEX]


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) <= 19 else None


class Fence:
    """The highest fencing token accepted on this proxy, shared through a locked file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def admit(self, token: int) -> bool:
        """Whether ``token`` may pass; records it when it is the new highest."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            highest = _number(os.pread(fd, 32, 0).decode("ascii", "replace").strip()) or 0
            if token < highest:
                return False
            if token > highest:
                data = f"{token}\n".encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
                os.fsync(fd)
            return True
        finally:
            os.close(fd)


def check(key: bytes, fence: Fence, user: str, password: str, now_ms: int) -> str:
    """``OK``, or ``ERR`` with the reason Squid logs."""
    parts = password.split(".")
    token = 0
    if user == PROBE_USER:
        if len(parts) != 2:
            return 'ERR message="malformed probe credential"'
        expires, mac = _number(parts[0]), parts[1]
        message = f"probe|{parts[0]}"
    else:
        if len(parts) != 3 or not user or "|" in user:
            return 'ERR message="malformed lease credential"'
        number, expires, mac = _number(parts[0]), _number(parts[1]), parts[2]
        if number is None:
            return 'ERR message="malformed lease credential"'
        token = number
        message = f"lease|{user}|{parts[0]}|{parts[1]}"
    if expires is None or not hmac.compare_digest(_mac(key, message), mac):
        return 'ERR message="credential not valid for this proxy"'
    if now_ms >= expires:
        return 'ERR message="lease expired"'
    if user != PROBE_USER and not fence.admit(token):
        return 'ERR message="fenced: a newer lease is in use"'
    return "OK"


def answer(key: bytes | None, fence: Fence, line: str, *, concurrent: bool) -> str:
    words = line.split()
    channel = ""
    if concurrent and words:
        channel, words = words[0] + " ", words[1:]
    if len(words) < 2:
        return channel + 'BH message="expected: user password"'
    if key is None:
        return channel + 'BH message="no proxy key: see the helper\'s messages in cache.log"'
    try:
        verdict = check(key, fence, unquote(words[0]), unquote(words[1]), time.time_ns() // 10**6)
    except OSError as exc:
        return channel + f'BH message="fencing state: {exc.strerror or exc}"'
    return channel + verdict


def read_key(path: str) -> bytes | None:
    try:
        with open(path, encoding="ascii") as file:
            return bytes.fromhex(file.read().strip())
    except (OSError, ValueError) as exc:
        # Squid copies a helper's stderr into cache.log; answering BH keeps Squid up, where
        # exiting would make it respawn the helper until it gives up.
        print(f"egress lease helper: cannot read the proxy key {path}: {exc}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Squid basic-auth helper for egress leases")
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--state-file", required=True)
    parser.add_argument("--concurrent", action="store_true")
    parser.add_argument("--instance", default="", help="ignored: names the instance in ps")
    args = parser.parse_args(argv)
    key = read_key(args.key_file)
    fence = Fence(args.state_file)
    for line in sys.stdin:
        if not line.strip():
            continue
        sys.stdout.write(answer(key, fence, line, concurrent=args.concurrent) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
