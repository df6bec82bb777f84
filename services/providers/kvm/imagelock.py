"""The download lock of one image on one host, kept in the host's pool like the image itself.

Executor replicas (separate processes, possibly separate machines) share the hypervisors and
nothing else, so the pool is the only place they can agree in. The lock is a small volume
``<base>-lock``: ``virStorageVolCreateXML`` refuses a name that exists
(``VIR_ERR_STORAGE_VOL_EXIST``) under the pool's own lock inside libvirtd, so exactly one caller
creates it. Its content says who holds it (a random token per acquisition, host name and pid) and
until when (the holder's deadline plus the time it needs to clean up, in epoch seconds).

Only the holder deletes leftovers, downloads, writes the marker, and deletes the lock; before the
marker it checks the lock still carries its token. A lock past its expiry (plus ``SKEW_GRACE``
for clocks that disagree) belongs to a holder that crashed: it is taken over. The takeover
must not delete a newer lock that a faster replica created meanwhile, and libvirt has no
compare-and-delete, so it goes through a second atomic create: a claim volume
``<base>-lock-<id of the stale lock>``. Only the claim's creator deletes the stale lock, after
checking that it is still the one judged stale; then everyone races to create the lock again.

Content the lock cannot be read from (created, not yet written; or made by hand) is judged by
the volume's mtime, which the host's clock sets.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs
import msgspec
import structlog

from services.providers.base import Transient
from services.providers.kvm.pure.domain import raw_volume_xml

log = structlog.get_logger("egress.provider.kvm")

LOCK_SUFFIX = "-lock"
# How far the clocks of the replicas (and of the hosts, for mtimes) may disagree: a lock is
# stale only this long after its holder's own deadline, and a holder never acts past it.
SKEW_GRACE = 60.0
# A takeover is a handful of calls in one round trip; its claim is stale after this.
CLAIM_SECONDS = 60.0
_CONTENT_MAX = 1024
CHUNK = 1 << 20


class LockLost(Transient):
    """Our lock was taken over (we ran past our deadline, or a clock is far off): someone else
    owns the image now, so this caller must not touch it; a retry finds it ready or waits."""


class LockInfo(msgspec.Struct, frozen=True):
    """What a lock (or a takeover claim) volume holds: JSON, readable with ``virsh vol-download``.
    ``created`` and ``expires`` are epoch seconds by the holder's clock."""

    token: str
    holder: str
    created: float
    expires: float

    def encode(self) -> bytes:
        return msgspec.json.encode(self)


@dataclass(frozen=True, slots=True)
class Seen:
    """A lock volume as read: its content when it parses, its mtime (host clock) if known, and
    an id that changes whenever the lock is re-created (names its takeover claim)."""

    info: LockInfo | None
    mtime: float | None
    ident: str

    def describe(self) -> str:
        if self.info is not None:
            return f"{self.info.holder} (token {self.info.token[:8]})"
        return "an unknown holder"


def lock_name(base: str) -> str:
    return f"{base}{LOCK_SUFFIX}"


def claim_name(base: str, ident: str) -> str:
    return f"{base}{LOCK_SUFFIX}-{ident}"


def new_lock(now: float, lifetime: float) -> LockInfo:
    """A fresh identity: a token of our own per acquisition, so two providers in one process
    (or a pid reused after a restart) never mistake each other's lock for theirs."""
    return LockInfo(
        token=secrets.token_hex(16),
        holder=f"{socket.gethostname()}:{os.getpid()}",
        created=now,
        expires=now + lifetime,
    )


def parse_lock(data: bytes) -> LockInfo | None:
    """The content, or None when it is not ours to read (empty, zeros, written by hand)."""
    try:
        info = msgspec.json.decode(data.rstrip(b"\0"), type=LockInfo)
    except msgspec.DecodeError:  # ValidationError included
        return None
    return info if info.token else None


def seen_from(data: bytes, mtime: float | None) -> Seen:
    info = parse_lock(data)
    # Unreadable content says nothing about identity: the mtime then tells re-creations apart.
    salt = b"" if info is not None else repr(mtime).encode()
    return Seen(info, mtime, hashlib.sha256(data + b"\n" + salt).hexdigest()[:16])


def is_stale(seen: Seen, now: float, fallback_lifetime: float) -> bool:
    """Whether its holder is surely gone: past its own expiry, or (content unreadable) older
    than the longest a holder may take. No mtime and no content: never judged stale."""
    if seen.info is not None:
        return now > seen.info.expires + SKEW_GRACE
    if seen.mtime is None:
        return False
    return now > seen.mtime + fallback_lifetime + SKEW_GRACE


# ------------------------------------------------------------------ libvirt (in the host thread)


def read_lock(conn: libvirt.virConnect, pool: libvirt.virStoragePool, name: str) -> Seen | None:
    """The lock (or claim) volume ``name``, or None when there is none."""
    volume = lookup_volume(pool, name)
    if volume is None:
        return None
    try:
        data = download_bytes(conn, volume, _CONTENT_MAX)
        mtime = _mtime(volume)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None  # released while we read it
        if not being_built(exc):
            raise
        # Its creator's createXML is still running: a lock, fresh, content not there yet.
        return Seen(None, None, "")
    return seen_from(data, mtime)


def being_built(exc: libvirt.libvirtError) -> bool:
    """libvirt refuses to read (or delete) a volume whose createXML has not returned yet."""
    return bool(exc.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID)


def try_create(
    conn: libvirt.virConnect, pool: libvirt.virStoragePool, name: str, info: LockInfo
) -> bool:
    """Create ``name`` holding ``info``; False when it exists (someone else holds it)."""
    data = info.encode()
    try:
        volume = pool.createXML(raw_volume_xml(name, len(data)), 0)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_STORAGE_VOL_EXIST:
            return False
        raise
    try:
        upload_bytes(conn, volume, data)
    except BaseException:
        # An empty lock would block everyone until its mtime ages out.
        _delete_quietly(pool, name)
        raise
    return True


def holds(conn: libvirt.virConnect, pool: libvirt.virStoragePool, base: str, token: str) -> bool:
    seen = read_lock(conn, pool, lock_name(base))
    return seen is not None and seen.info is not None and seen.info.token == token


def check_held(
    conn: libvirt.virConnect, pool: libvirt.virStoragePool, base: str, token: str, then: str
) -> None:
    """Raise LockLost unless the lock carries ``token``; ``then`` says what is not done."""
    if not holds(conn, pool, base, token):
        raise LockLost(
            f"the download lock of {base} is no longer ours (taken over: this download ran "
            f"past its deadline, or the replicas' clocks disagree by over a minute); {then}"
        )


def acquire(
    conn: libvirt.virConnect,
    pool: libvirt.virStoragePool,
    base: str,
    seen: Seen | None,
    info: LockInfo,
    *,
    fallback_lifetime: float,
) -> bool:
    """Take the lock for ``info``: ``seen`` is the lock as last read (None: there was none),
    taken over first when stale. False when someone else holds it now."""
    if seen is not None:
        if not is_stale(seen, info.created, fallback_lifetime):
            return False
        claim = new_lock(info.created, CLAIM_SECONDS)
        if not take_over(conn, pool, base, seen, claim):
            return False
    return try_create(conn, pool, lock_name(base), info)


def drop(pool: libvirt.virStoragePool, base: str) -> None:
    """Delete the lock; only its holder calls this, right after ``holds``/``check_held``."""
    delete_volume(pool, lock_name(base))


def take_over(
    conn: libvirt.virConnect,
    pool: libvirt.virStoragePool,
    base: str,
    stale: Seen,
    claim: LockInfo,
) -> bool:
    """Delete the stale lock ``stale`` unless it changed meanwhile; False when another replica
    is taking it over right now (its claim exists)."""
    name = claim_name(base, stale.ident)
    if not try_create(conn, pool, name, claim):
        other = read_lock(conn, pool, name)
        if other is not None and is_stale(other, claim.created, CLAIM_SECONDS):
            # Its creator died within the few calls below: free the way for the next round.
            delete_volume(pool, name)
        return False
    try:
        current = read_lock(conn, pool, lock_name(base))
        if current is not None and current.ident == stale.ident:
            drop(pool, base)
            log.warning(
                "kvm image lock taken over",
                volume=base,
                stale_holder=stale.describe(),
                by=claim.holder,
            )
    finally:
        _delete_quietly(pool, name)
    return True


# The volume helpers the lock needs; images.py and volumes.py use them too (images.py re-exports
# them: it builds on this module, so they cannot live there).


def lookup_volume(pool: libvirt.virStoragePool, name: str) -> libvirt.virStorageVol | None:
    """The volume, or None when the pool has none of that name."""
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise


def delete_volume(pool: libvirt.virStoragePool, name: str) -> bool:
    """Delete ``name`` if it exists; True when it did."""
    volume = lookup_volume(pool, name)
    if volume is None:
        return False
    try:
        volume.delete(0)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_VOL:
            raise
    return True


def upload_bytes(conn: libvirt.virConnect, volume: libvirt.virStorageVol, data: bytes) -> None:
    """Small contents (seed ISO, marker, lock) in one stream."""
    stream = conn.newStream(0)
    try:
        volume.upload(stream, 0, len(data), 0)
        send_all(stream, data)
        stream.finish()
    except BaseException:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()
        raise


def download_bytes(conn: libvirt.virConnect, volume: libvirt.virStorageVol, limit: int) -> bytes:
    """At most ``limit`` bytes of a volume: markers, locks, and seeds read back by tests."""
    stream = conn.newStream(0)
    chunks: list[bytes] = []
    try:
        volume.download(stream, 0, limit, 0)
        while True:
            got = stream.recv(CHUNK)
            if not got:
                break
            if isinstance(got, int):  # -2: only on non-blocking streams, which this is not
                raise RuntimeError(f"unexpected stream status {got}")
            chunks.append(got)
        stream.finish()
    except BaseException:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()
        raise
    return b"".join(chunks)


def send_all(stream: libvirt.virStream, data: bytes) -> None:
    view = memoryview(data)
    while view:
        sent = stream.send(bytes(view))
        if sent <= 0:
            raise RuntimeError(f"libvirt stream refused data (status {sent})")
        view = view[sent:]


def _delete_quietly(pool: libvirt.virStoragePool, name: str) -> None:
    try:
        delete_volume(pool, name)
    except libvirt.libvirtError as exc:
        log.warning("kvm lock volume not deleted", volume=name, error=str(exc))


def _mtime(volume: libvirt.virStorageVol) -> float | None:
    try:
        root = ET.fromstring(volume.XMLDesc(0))
    except ET.ParseError:
        return None
    text = root.findtext("target/timestamps/mtime")
    try:
        return float(text) if text else None
    except ValueError:
        return None
