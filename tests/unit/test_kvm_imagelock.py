"""The image lock's pure rules: what a lock volume holds, how it reads back, when it is stale."""

from __future__ import annotations

import pytest

from services.providers.kvm.imagelock import (
    SKEW_GRACE,
    LockInfo,
    claim_name,
    is_stale,
    lock_name,
    new_lock,
    parse_lock,
    seen_from,
)
from services.providers.kvm.pure.domain import is_per_vm_volume

BASE = "egress-base-0123456789abcdef0123456789abcdef"


def test_a_lock_reads_back_as_written() -> None:
    info = new_lock(1000.0, 3600.0)
    assert parse_lock(info.encode()) == info
    assert (info.created, info.expires) == (1000.0, 4600.0)
    assert ":" in info.holder
    # A volume is allocated in blocks: what follows the content reads as zeros.
    assert parse_lock(info.encode() + b"\0" * 512) == info


def test_every_acquisition_has_a_token_of_its_own() -> None:
    assert new_lock(0.0, 1.0).token != new_lock(0.0, 1.0).token


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\0" * 64,  # created, not yet written
        b"not json",
        b"[1, 2]",
        b'{"holder": "h", "created": 1, "expires": 2}',
        b'{"token": "", "holder": "h", "created": 1, "expires": 2}',
        b'{"token": "t", "holder": "h", "created": "yesterday", "expires": 2}',
        b"\xff\xfe",
    ],
)
def test_content_that_is_not_a_lock_is_unreadable(data: bytes) -> None:
    assert parse_lock(data) is None


def test_a_readable_lock_is_stale_only_past_its_expiry_and_the_skew_grace() -> None:
    seen = seen_from(LockInfo("t", "h", 100.0, 200.0).encode(), mtime=100.0)
    assert not is_stale(seen, 200.0 + SKEW_GRACE, fallback_lifetime=1.0)
    assert is_stale(seen, 200.0 + SKEW_GRACE + 0.1, fallback_lifetime=1.0)


def test_an_unreadable_lock_is_judged_by_its_mtime_and_the_waiters_lifetime() -> None:
    seen = seen_from(b"\0" * 16, mtime=100.0)
    assert seen.info is None
    assert not is_stale(seen, 100.0 + 3600.0 + SKEW_GRACE, fallback_lifetime=3600.0)
    assert is_stale(seen, 100.0 + 3600.0 + SKEW_GRACE + 0.1, fallback_lifetime=3600.0)
    assert not is_stale(seen_from(b"", mtime=None), 1e12, fallback_lifetime=1.0)


def test_the_id_of_a_lock_changes_when_it_is_created_again() -> None:
    first, second = LockInfo("a", "h", 1.0, 2.0), LockInfo("b", "h", 1.0, 2.0)
    assert seen_from(first.encode(), 5.0).ident == seen_from(first.encode(), 9.0).ident
    assert seen_from(first.encode(), 5.0).ident != seen_from(second.encode(), 5.0).ident
    # Unreadable content: the mtime tells one creation from the next.
    assert seen_from(b"", 5.0).ident != seen_from(b"", 9.0).ident


def test_lock_volumes_are_never_taken_for_a_vms_volumes() -> None:
    ident = seen_from(b"", 1.0).ident
    names = {lock_name(BASE), claim_name(BASE, ident)}
    assert len(names) == 2
    assert all(is_per_vm_volume(name) is None for name in names)
    assert all(name.startswith(BASE) for name in names)


def test_seen_says_who_holds_it() -> None:
    info = LockInfo("0123456789abcdef", "exec-7:42", 1.0, 2.0)
    assert seen_from(info.encode(), None).describe() == "exec-7:42 (token 01234567)"
    assert seen_from(b"", None).describe() == "an unknown holder"
