"""Reading stored messages whatever they hold, and the ledger of what was skipped."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from events import codec
from events.reading import apply_tolerantly, recorded
from events.schemas import HealthChanged
from events.skips import UNDECODABLE, UNKNOWN_TYPE, UNUSABLE, Skip, SkipLedger
from events.store import Recorded, Unreadable
from projections.proxy import ProxyView, apply

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def read(data: bytes, headers: dict[str, str] | None = None) -> tuple[Recorded, Skip | None]:
    return recorded("PROXY", 7, "proxy.u1.health", T0, data, headers)


def test_a_good_event_reads_as_itself() -> None:
    item, skip = read(codec.encode(HealthChanged(healthy=True)), {"Nats-Msg-Id": "m"})
    assert skip is None
    assert item.event == HealthChanged(healthy=True)
    assert (item.seq, item.msg_id) == (7, "m")


@pytest.mark.parametrize(
    ("data", "headers", "reason", "event_type"),
    [
        (b"{not json", {"Egress-Event-Type": "HealthChanged"}, UNDECODABLE, "HealthChanged"),
        (b'{"type":"HealthChanged","healthy":"yes"}', {}, UNDECODABLE, "?"),
        (b"\x00\xff", {}, UNDECODABLE, "?"),
        (b'{"type":"Later"}', {"Egress-Event-Type": "Later"}, UNKNOWN_TYPE, "Later"),
        (b'{"type":"Later"}', {}, UNKNOWN_TYPE, "Later"),
    ],
)
def test_a_bad_message_becomes_a_placeholder_at_its_sequence(
    data: bytes, headers: dict[str, str], reason: str, event_type: str
) -> None:
    item, skip = read(data, headers)
    assert skip is not None
    assert (skip.reason, skip.event_type, skip.seq, skip.subject) == (
        reason,
        event_type,
        7,
        "proxy.u1.health",
    )
    assert isinstance(item.event, Unreadable)
    assert item.seq == 7


def test_a_fold_that_raises_moves_past_the_event() -> None:
    good, _ = read(codec.encode(HealthChanged(healthy=True)))

    def overflowing(view: ProxyView | None, item: Recorded) -> ProxyView:
        if isinstance(item.event, HealthChanged):
            raise OverflowError("date value out of range")
        return apply(view, item)

    declared = ProxyView(uid="u1", name="p1", last_seq=3)  # a proxy exists from its declaration
    view, skip = apply_tolerantly(overflowing, declared, good, "PROXY")
    assert skip is not None
    assert skip.reason == UNUSABLE
    assert skip.event_type == "HealthChanged"
    assert "OverflowError" in skip.detail
    assert view is not None
    assert view.last_seq == 7
    assert view.healthy is None


def test_a_fold_that_raises_on_everything_keeps_the_view() -> None:
    good, _ = read(codec.encode(HealthChanged(healthy=True)))
    before = ProxyView(uid="u1", last_seq=3)

    def broken(view: ProxyView | None, item: Recorded) -> ProxyView:
        raise ValueError("broken invariant")

    view, skip = apply_tolerantly(broken, before, good, "PROXY")
    assert view is before
    assert skip is not None


def test_a_fold_error_that_is_not_about_the_event_propagates() -> None:
    good, _ = read(codec.encode(HealthChanged(healthy=True)))

    def out_of_memory(view: ProxyView | None, item: Recorded) -> ProxyView:
        raise MemoryError

    with pytest.raises(MemoryError):
        apply_tolerantly(out_of_memory, None, good, "PROXY")


def test_the_ledger_counts_each_event_once_however_often_it_is_read() -> None:
    ledger = SkipLedger()
    skip = Skip("PROXY", "proxy.u1.status", 5, "PhaseChanged", UNDECODABLE)
    assert ledger.note(skip) is True
    assert ledger.note(skip) is False
    assert ledger.note(Skip("PROXY", "proxy.u2.status", 6, "PhaseChanged", UNDECODABLE))
    assert ledger.counts == {("PROXY", "PhaseChanged", UNDECODABLE): 2}


def test_the_ledger_memory_is_bounded() -> None:
    ledger = SkipLedger(remember=3)
    for seq in range(10):
        ledger.note(Skip("LEASE", "lease.u", seq, "LeaseAcquired", UNDECODABLE))
    assert ledger.total() == 10
    assert len(ledger._seen) == 3
