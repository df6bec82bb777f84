"""A kept state advanced by the events that provably follow it, without a read
(services/reconciler/cache.py ``States.chain``, events/codec.py ``expected_last``)."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from events import codec, subjects
from events.schemas import CreateInstance, Phase, PhaseChanged, ProxyDeclared, ProxySpec
from events.store import History, Recorded, derive_msg_id
from projections.proxy import fold as proxy_fold
from services.reconciler.cache import States
from services.reconciler.pure.decision import Decision
from services.reconciler.pure.view import fold
from services.reconciler.service import new_events

UID = "p-1"
FILTER = subjects.proxy(UID).filter_subject
NOW = datetime(2026, 12, 3, tzinfo=UTC)


def recorded(event: object, seq: int) -> Recorded:
    return Recorded(
        event=event,  # type: ignore[arg-type]
        seq=seq,
        subject=f"proxy.{UID}.{type(event).category}",  # type: ignore[attr-defined]
        timestamp=NOW,
        msg_id=f"m{seq}",
    )


DECLARED = recorded(ProxyDeclared(uid=UID, namespace="ns", name="a", spec=ProxySpec()), 1)
CREATE = recorded(
    CreateInstance(command_id="c1", provider="local", instance_name="i", spec=ProxySpec()), 5
)
PHASE = recorded(PhaseChanged(phase=Phase.PROVISIONING), 9)


def headers(after: str, subject: str = FILTER) -> dict[str, str]:
    return {codec.HDR_EXPECTED_SEQ: after, codec.HDR_EXPECTED_SUBJECT: subject}


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (headers("0"), 0),
        (headers("41"), 41),
        (headers("18446744073709551615"), 18446744073709551615),
        (None, None),
        ({}, None),
        ({codec.HDR_EXPECTED_SEQ: "3"}, None),  # no scope: checked against the subject alone
        (headers("3", "proxy.other.>"), None),  # another aggregate's scope
        (headers("3", "proxy.*.*"), None),
        (headers(""), None),
        (headers("-1"), None),
        (headers("+3"), None),
        (headers(" 3"), None),
        (headers("3.0"), None),
        (headers("٣"), None),  # a digit, but not ASCII
        (headers("1" * 21), None),
        (headers("0x10"), None),
    ],
)
def test_only_a_sequence_the_server_checked_for_this_proxy_is_trusted(
    found: dict[str, str] | None, expected: int | None
) -> None:
    assert codec.expected_last(found, FILTER) == expected


def test_a_proxy_s_first_event_starts_its_state_without_a_read() -> None:
    states = States()
    assert states.chain(UID, DECLARED, 0)
    kept = states.exactly(UID, 1)
    assert kept == fold(UID, [DECLARED])


def test_events_following_the_kept_state_are_folded_on_in_order() -> None:
    states = States()
    states.chain(UID, DECLARED, 0)
    assert states.chain(UID, CREATE, 1)
    assert states.chain(UID, PHASE, 5)
    assert states.exactly(UID, 9) == fold(UID, [DECLARED, CREATE, PHASE])


def test_a_gap_or_an_unknown_predecessor_leaves_the_state_alone() -> None:
    states = States()
    assert not states.chain(UID, CREATE, 1)  # nothing kept as of 1
    states.chain(UID, DECLARED, 0)
    assert not states.chain(UID, PHASE, 5)  # the state is as of 1, not 5
    assert not states.chain(UID, PHASE, None)  # appended without the check
    assert states.exactly(UID, 1) == fold(UID, [DECLARED])
    assert states.exactly(UID, 9) is None


async def test_a_redelivered_or_older_event_never_moves_the_state_back() -> None:
    states = States()
    states.chain(UID, DECLARED, 0)
    states.chain(UID, CREATE, 1)
    assert not states.chain(UID, DECLARED, 0)  # redelivered: the state is past it
    assert states.exactly(UID, 5) is not None
    await states.keep(UID, fold(UID, [DECLARED]), 1, read=1)  # an overlapping reconcile's read
    assert states.exactly(UID, 5) == fold(UID, [DECLARED, CREATE])


def test_a_decision_s_command_is_appended_last_under_the_id_of_its_position() -> None:
    """The executor's answer can then expect the command's sequence (D168); the ids are those
    of the decision's own order, so a replica of the earlier order writes the same ids."""
    decision = Decision((CREATE.event, PHASE.event), "create")  # type: ignore[arg-type]
    made = new_events(UID, decision, History([], 7), "cause")
    assert [type(n.event) for n in made] == [PhaseChanged, CreateInstance]
    ids = {type(n.event): n.msg_id for n in made}
    assert ids[CreateInstance] == derive_msg_id("reconcile", UID, "7", "0")
    assert ids[PhaseChanged] == derive_msg_id("reconcile", UID, "7", "1")
    assert {n.causation_id for n in made} == {"cause"}
    alone = Decision((PHASE.event,), "ready")  # type: ignore[arg-type]
    assert [n.event for n in new_events(UID, alone, History([], 7), "")] == [PHASE.event]


def test_every_fold_reads_a_decision_in_either_order() -> None:
    """Builds before D168 stored a decision's command before its status (the golden log keeps
    that order), builds since store it after: the reconciler's state and the proxy view must
    come out the same, but for the sequence each last read."""
    before = [DECLARED, recorded(CREATE.event, 2), recorded(PHASE.event, 3)]
    since = [DECLARED, recorded(PHASE.event, 2), recorded(CREATE.event, 3)]
    assert fold(UID, before) == fold(UID, since)
    old, new = proxy_fold(before), proxy_fold(since)
    assert old is not None
    assert new is not None
    assert msgspec.structs.replace(old, last_seq=0) == msgspec.structs.replace(new, last_seq=0)
