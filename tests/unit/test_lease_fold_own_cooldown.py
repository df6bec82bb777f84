"""A proxy resting after a lease of client C is C's to lease again at once, and nobody else's
(docs/decisions/0153-a-client-takes-back-its-own-proxy.md): the fold's rule, and the queries
the API chooses with, agreeing claim by claim."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from events.schemas import Event, LeaseAcquired, LeaseExpired, LeaseReleased, LeaseReported
from projections.cooldown import Claimant, follows
from projections.lease import LeaseView, fold
from projections.lease_queries import available_at, is_available
from tests.unit.test_lease_fold import Log, at

COOLDOWN = 10.0


def claim(
    lease_id: str, client: str, holder: str = "", ttl: float = 5.0, target: str = ""
) -> LeaseAcquired:
    return LeaseAcquired(
        lease_id=lease_id,
        proxy_uid="p1",
        holder=holder,
        client=client,
        ttl_seconds=ttl,
        cooldown_seconds=COOLDOWN,
        target=target,
    )


def release(lease_id: str, client: str, cooldown: float = COOLDOWN) -> LeaseReleased:
    return LeaseReleased(
        lease_id=lease_id, proxy_uid="p1", client=client, cooldown_seconds=cooldown
    )


@dataclass(frozen=True)
class Story:
    """Events at their timestamps; ``holds``: the lease the last claim leaves holding the
    proxy ("" for none); ``granted``: the claims (by lease id) the fold granted, in order."""

    name: str
    steps: tuple[tuple[float, Event], ...]
    holds: str
    granted: tuple[str, ...]


A1 = claim("a1", "crawler-a", "h1")
STORIES = [
    Story(
        "the same client takes back the proxy it released, another holder of its own too",
        ((0, A1), (1, release("a1", "crawler-a")), (1.5, claim("a2", "crawler-a", "h2"))),
        holds="a2",
        granted=("a1", "a2"),
    ),
    Story(
        "another client waits for the whole cooldown",
        (
            (0, A1),
            (1, release("a1", "crawler-a")),
            (2, claim("b1", "crawler-b", "h1")),  # naming A's holder changes nothing
            (10.9, claim("b2", "crawler-b")),
            (11, claim("b3", "crawler-b")),
        ),
        holds="b3",
        granted=("a1", "b3"),
    ),
    Story(
        "an expiry nobody recorded rests the proxy for others, not for its client",
        ((0, A1), (6, claim("b1", "crawler-b")), (7, claim("a2", "crawler-a"))),
        holds="a2",
        granted=("a1", "a2"),
    ),
    Story(
        "a recorded expiry too",
        (
            (0, A1),
            (5.5, LeaseExpired(lease_id="a1", proxy_uid="p1")),
            (6, claim("a2", "crawler-a", "h9")),
        ),
        holds="a2",
        granted=("a1", "a2"),
    ),
    Story(
        "the rest is the last lease's: a retake's own release rests the proxy for the others",
        (
            (0, A1),
            (1, release("a1", "crawler-a")),
            (2, claim("a2", "crawler-a")),
            (3, release("a2", "crawler-a")),
            (12, claim("b1", "crawler-b")),
            (13, claim("b2", "crawler-b")),
        ),
        holds="b2",
        granted=("a1", "a2", "b2"),
    ),
    Story(
        "after another client's lease, the first client waits like anyone",
        (
            (0, A1),
            (1, release("a1", "crawler-a", cooldown=0)),
            (2, claim("b1", "crawler-b")),
            (3, release("b1", "crawler-b")),
            (4, claim("a2", "crawler-a", "h1")),
        ),
        holds="",
        granted=("a1", "b1"),
    ),
    Story(
        "a client's own lease still held is no rest: a second claim is refused",
        ((0, A1), (1, claim("a2", "crawler-a", "h1"))),
        holds="a1",
        granted=("a1",),
    ),
    Story(
        "open mode: the same holder takes it back",
        ((0, claim("o1", "", "crawl-1")), (1, release("o1", "")), (2, claim("o2", "", "crawl-1"))),
        holds="o2",
        granted=("o1", "o2"),
    ),
    Story(
        "open mode: another holder waits",
        ((0, claim("o1", "", "crawl-1")), (1, release("o1", "")), (2, claim("o2", "", "crawl-2"))),
        holds="",
        granted=("o1",),
    ),
    Story(
        "open mode: no holder named is nobody's own",
        ((0, claim("o1", "")), (1, release("o1", "")), (2, claim("o2", ""))),
        holds="",
        granted=("o1",),
    ),
    Story(
        "a named client is not the open mode's holder of the same name",
        ((0, claim("o1", "", "h1")), (1, release("o1", "")), (2, claim("a1", "crawler-a", "h1"))),
        holds="",
        granted=("o1",),
    ),
    Story(
        "an anonymous claim does not take a named client's rest by naming its holder",
        ((0, A1), (1, release("a1", "crawler-a")), (2, claim("o1", "", "h1"))),
        holds="",
        granted=("a1",),
    ),
    Story(
        "a back-off for the target still holds for the client that reported it",
        (
            (0, A1),
            (
                0.5,
                LeaseReported(
                    lease_id="a1",
                    proxy_uid="p1",
                    outcome="blocked",
                    target="shop.example",
                    backoff_seconds=60,
                ),
            ),
            (1, release("a1", "crawler-a")),
            (2, claim("a2", "crawler-a", "h1", target="shop.example")),
            (3, claim("a3", "crawler-a", "h1", target="other.example")),
        ),
        holds="a3",
        granted=("a1", "a3"),
    ),
]


def who(event: LeaseAcquired) -> Claimant:
    return Claimant(client=event.client, holder=event.holder)


@pytest.mark.parametrize("story", STORIES, ids=lambda s: s.name)
def test_a_rest_is_skipped_only_by_its_own_client(story: Story) -> None:
    log = Log()
    granted: list[str] = []
    for seconds, event in story.steps:
        before = log.view() if log.events else None
        log.add(seconds, event)
        if not isinstance(event, LeaseAcquired):
            continue
        after = log.view()
        holds = after.current is not None and after.current.lease_id == event.lease_id
        if holds:
            granted.append(event.lease_id)
            assert after.current is not None
            assert after.fencing_token == after.current.fencing_token == len(log.events)
        # What the API offers this claimant is what the fold grants it, claim by claim.
        assert is_available(before, at(seconds), event.target, who(event)) is holds
    view = log.view()
    assert (view.current.lease_id if view.current else "") == story.holds
    assert tuple(granted) == story.granted
    assert view.rejected == sum(isinstance(e, LeaseAcquired) for _, e in story.steps) - len(
        story.granted
    )


def test_the_view_remembers_whose_rest_it_is() -> None:
    view = Log().add(0, A1).add(1, release("a1", "crawler-a")).view()
    assert (view.cooldown_until, view.cooldown_client, view.cooldown_holder) == (
        at(11),
        "crawler-a",
        "h1",
    )
    # The fleet's answer (nobody's own) and the two clients'.
    assert available_at(view) == at(11)
    assert available_at(view, who=Claimant(client="crawler-b", holder="h1")) == at(11)
    assert available_at(view, who=Claimant(client="crawler-a")) is None


def test_a_held_lease_is_free_to_its_client_at_its_end_and_to_others_after_the_rest() -> None:
    view = Log().add(0, A1).view()
    assert available_at(view) == at(15)
    assert available_at(view, who=Claimant(client="crawler-a")) == at(5)
    assert available_at(view, who=Claimant(client="crawler-b")) == at(15)


def test_a_rest_that_names_nobody_is_nobody_s_own() -> None:
    """A view in an older shape (the new fields at their defaults) rests for every caller."""
    view = LeaseView(proxy_uid="p1", cooldown_until=at(10))
    assert not is_available(view, at(5), who=Claimant(client=""))
    assert not is_available(view, at(5), who=Claimant(client="", holder="h1"))
    assert not is_available(view, at(5), who=Claimant(client="crawler-a", holder="h1"))
    assert is_available(view, at(10), who=Claimant(client=""))


@pytest.mark.parametrize(
    ("claimant", "client", "holder", "own"),
    [
        (Claimant(client="a", holder="x"), "a", "y", True),
        (Claimant(client="a"), "b", "", False),
        (Claimant(client="", holder="x"), "", "x", True),
        (Claimant(client="", holder="x"), "", "y", False),
        (Claimant(client=""), "", "", False),
        (Claimant(client="", holder="x"), "a", "x", False),
        (None, "a", "x", False),
    ],
)
def test_follows(claimant: Claimant | None, client: str, holder: str, own: bool) -> None:
    assert follows(claimant, client, holder) is own


def test_fold_of_the_same_log_is_the_same_on_every_replica() -> None:
    """The rule reads only the events: a rebuild agrees with the running fold."""
    log = Log().add(0, A1).add(1, release("a1", "crawler-a")).add(2, claim("a2", "crawler-a"))
    halfway = fold(log.events[:2])
    assert fold(log.events[2:], halfway) == log.view()
