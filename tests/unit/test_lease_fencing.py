"""Fencing tokens in the lease fold, without servers: a token is its grant's stream sequence, so
a fold that starts after older events aged out of ``LEASE`` (a replica that rebuilt its view)
gives tokens above every token an earlier fold gave
(docs/decisions/0080-fencing-tokens-are-the-grant-s.md)."""

from __future__ import annotations

from itertools import pairwise

from events.schemas import Event, LeaseAcquired, LeaseReleased, LeaseReported
from events.store import Recorded
from projections.lease import LeaseView, apply, fold
from projections.lease_queries import find
from tests.unit.test_lease_fold import acquired, at

PROXIES = ("p1", "p2")


def claim(uid: str, lease_id: str) -> LeaseAcquired:
    return LeaseAcquired(lease_id=lease_id, proxy_uid=uid, holder="h", ttl_seconds=600)


def stream() -> list[Recorded]:
    """One stream, two proxies, an event a second: a sequence counts every event of ``LEASE``,
    so one proxy's sequences have gaps. p1 is leased again and again, and each of its leases
    sees a claim the fold refuses; p2 is leased twice early on, then stays idle."""
    events: list[tuple[str, Event]] = []
    for i in range(6):
        events += [
            ("p1", claim("p1", f"a{i}")),
            ("p1", claim("p1", f"refused{i}")),  # a{i} holds p1
        ]
        if i < 2:
            events += [
                ("p2", claim("p2", f"b{i}")),
                ("p2", LeaseReported(lease_id=f"b{i}", proxy_uid="p2", outcome="success")),
                ("p2", LeaseReleased(lease_id=f"b{i}", proxy_uid="p2")),
            ]
        events.append(("p1", LeaseReleased(lease_id=f"a{i}", proxy_uid="p1")))
    return [
        Recorded(event=event, seq=seq, subject=f"lease.{uid}", timestamp=at(seq))  # type: ignore[arg-type]
        for seq, (uid, event) in enumerate(events, start=1)
    ]


def grants(events: list[Recorded]) -> dict[str, list[tuple[int, int]]]:
    """Per proxy, (sequence, token) of every claim the fold granted, in log order."""
    views: dict[str, LeaseView] = {}
    out: dict[str, list[tuple[int, int]]] = {uid: [] for uid in PROXIES}
    for recorded in events:
        uid = recorded.subject.removeprefix("lease.")
        view = views[uid] = apply(views.get(uid), recorded)
        granted = view.current is not None and view.current.seq == recorded.seq
        if isinstance(recorded.event, LeaseAcquired) and granted:
            out[uid].append((recorded.seq, view.fencing_token))
    return out


def test_a_token_is_the_grants_stream_sequence() -> None:
    found = grants(stream())
    for uid in PROXIES:
        assert found[uid], uid
        assert all(seq == token for seq, token in found[uid])
        tokens = [token for _, token in found[uid]]
        assert all(a < b for a, b in pairwise(tokens))
    # Not consecutive: refused claims, releases and the other proxy's events sit in between.
    assert [token for _, token in found["p1"]] == [1, 7, 13, 16, 19, 22]
    assert [token for _, token in found["p2"]] == [3, 9]


def quiet(events: list[Recorded]) -> set[int]:
    """The sequences after which no proxy holds a lease: where age-out can cut the history
    without cutting a lease in two (no lease outlives its grant: ``MAX_LEASE_SECONDS``)."""
    views: dict[str, LeaseView] = {}
    out = set()
    for recorded in events:
        uid = recorded.subject.removeprefix("lease.")
        views[uid] = apply(views.get(uid), recorded)
        if all(view.current is None for view in views.values()):
            out.add(recorded.seq)
    return out


def test_a_fold_after_age_out_gives_tokens_above_every_earlier_one() -> None:
    events = stream()
    whole = grants(events)
    calm = quiet(events)
    assert len(calm) > 3
    for cut in range(1, len(events)):
        # A replica started once the first ``cut`` events had aged out of the stream, and the
        # one that has been running since sequence 1 and gave the tokens up to ``cut``.
        later = grants(events[cut:])
        for uid in PROXIES:
            before = [token for seq, token in whole[uid] if seq <= cut]
            after = [token for _, token in later[uid]]
            assert all(a < b for a, b in pairwise(before + after)), (cut, uid)
            if cut in calm:
                # Where age-out really cuts, both replicas grant the same claims, same tokens.
                assert later[uid] == [(s, t) for s, t in whole[uid] if s > cut], (cut, uid)


def test_an_idle_proxy_whose_history_aged_out_does_not_start_again_at_one() -> None:
    events = stream()
    first = fold([r for r in events if r.subject == "lease.p2"])
    assert first is not None
    gone = events[-1].seq
    # Every event of p2 aged out; the next claim on it is the next event of the stream.
    again = Recorded(
        event=claim("p2", "back"), seq=gone + 1, subject="lease.p2", timestamp=at(gone + 100)
    )
    fresh = apply(None, again)  # a replica that never saw p2's history
    running = apply(first, again)  # the replica that has been running all along
    assert fresh.lease_id == running.lease_id == "back"
    assert fresh.fencing_token == running.fencing_token == gone + 1
    assert fresh.fencing_token > first.fencing_token


def test_tokens_increase_on_a_log_whose_sequences_do_not() -> None:
    """A log made by hand may number events oddly (JetStream and the in-memory store never do):
    the token is never less than the previous token + 1, so it still strictly increases."""
    view = None
    tokens = []
    for i, (seq, lease_id) in enumerate([(5, "a"), (5, "b"), (2, "c"), (9, "d"), (10, "e")]):
        claimed = Recorded(event=acquired(lease_id), seq=seq, subject="lease.p1", timestamp=at(i))
        view = apply(view, claimed)
        record = find(view, lease_id)
        assert record is not None
        tokens.append(record.fencing_token)
        ended = LeaseReleased(lease_id=lease_id, proxy_uid="p1")
        view = apply(view, Recorded(event=ended, seq=seq, subject="lease.p1", timestamp=at(i + 1)))
    assert tokens == [5, 6, 7, 9, 10]
