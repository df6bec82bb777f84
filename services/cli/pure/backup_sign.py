"""A backup's signature: an HMAC-SHA256 of its manifest under a key the operator keeps apart
from the backups (docs/operations.md, "Backup and restore";
docs/decisions/0136-a-store-is-found-by-what-runs-on-it.md, "Backups").

Why the manifest alone: it names every stream file with its size and SHA-256, so a signed
manifest fixes every byte a restore reads. Without a key, ``restore --check`` proves that the
files agree with the manifest, which anyone who can write the directory can arrange (rewrite an
event, recompute the checksums); with one, that the manifest is the one a holder of the key
signed.

Pure: bytes in, values out.
"""

from __future__ import annotations

import hashlib
import hmac

from services.cli.pure.backup_manifest import BackupDamaged

SIGNATURE = "manifest.json.hmac"
SCHEME = "hmac-sha256"
MIN_KEY_BYTES = 32
"""As the lease secret's: ``openssl rand -hex 32`` makes one."""
_DOMAIN = b"egress-proxies backup manifest v1\n"
"""Keeps a signature of a manifest from being one of anything else made with the same key."""


def check_key(key: bytes, where: str) -> bytes:
    """``key`` if it can sign; ``ValueError`` naming ``where`` (the option or variable) and the
    fix if it is too short to be a secret."""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{where}: the signing key has {len(key)} bytes, fewer than {MIN_KEY_BYTES}; use a "
            "random one, e.g. `openssl rand -hex 32`, kept apart from the backups"
        )
    return key


def sign(key: bytes, manifest: bytes) -> bytes:
    """The signature file's content for ``manifest`` (its exact bytes)."""
    mac = hmac.new(key, _DOMAIN + manifest, hashlib.sha256).hexdigest()
    return f"{SCHEME}:{mac}\n".encode()


def verify(key: bytes, manifest: bytes, signature: bytes | None) -> None:
    """Refuses (``BackupDamaged`` naming the signature file) a missing signature, one in another
    form, or one that another manifest or another key made."""
    if signature is None:
        raise BackupDamaged(
            SIGNATURE,
            "is missing: a signing key was given, and this backup is unsigned or its signature "
            "was removed; restore it without --sign-key only if you trust its directory",
        )
    if not hmac.compare_digest(signature.strip(), sign(key, manifest).strip()):
        raise BackupDamaged(
            SIGNATURE,
            "does not match manifest.json under this key: the backup was changed after it was "
            "signed, or signed with another key",
        )
