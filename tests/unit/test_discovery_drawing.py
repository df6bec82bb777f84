"""Drawing a candidate without copying the fleet (services/discovery/pure/drawing.py): the
indexed set against a plain set, the sparse shuffle against the textbook one, a live set that
changes between draws, and the index handing out its live members."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from events.schemas import Phase, ProxySpec
from projections.proxy import ProxyView
from services.discovery.pure.candidates import CandidateIndex
from services.discovery.pure.drawing import NONE, Candidates, Drawable, random_order

UIDS = st.sampled_from([f"p{i}" for i in range(12)])


@given(st.lists(st.tuples(st.booleans(), UIDS), max_size=80))
def test_a_drawable_holds_what_a_set_would(ops: list[tuple[bool, str]]) -> None:
    drawable, model = Drawable(), set[str]()
    for add, uid in ops:
        (drawable.add if add else drawable.discard)(uid)
        (model.add if add else model.discard)(uid)
        assert sorted(drawable) == sorted(model)
        assert len(drawable) == len(model)
        assert all((uid in drawable) == (uid in model) for uid in {u for _, u in ops})
        assert sorted(drawable[i] for i in range(len(drawable))) == sorted(model)


def textbook(items: Sequence[str], rng: random.Random) -> Iterator[str]:
    """The shuffle as it was before: a copy, swapped in place, one draw per item taken."""
    pool = list(items)
    for end in range(len(pool), 0, -1):
        pick = int(rng.random() * end)
        pool[pick], pool[end - 1] = pool[end - 1], pool[pick]
        yield pool[end - 1]


@given(st.integers(0, 40), st.integers(0, 2**32))
def test_the_sparse_shuffle_draws_what_the_textbook_one_draws(size: int, seed: int) -> None:
    items = [f"p{i}" for i in range(size)]
    assert list(random_order(items, random.Random(seed))) == list(
        textbook(items, random.Random(seed))
    )


@given(st.integers(1, 30), st.integers(0, 2**32), st.lists(st.tuples(st.booleans(), UIDS)))
def test_a_live_set_that_changes_between_draws_gives_no_uid_twice_and_never_raises(
    size: int, seed: int, changes: list[tuple[bool, str]]
) -> None:
    live = Drawable()
    for i in range(size):
        live.add(f"p{i % 12}")
    given_uids: list[str] = []
    order = random_order(live, random.Random(seed))
    for add, uid in changes:
        got = next(order, None)
        if got is None:
            break
        given_uids.append(got)
        (live.add if add else live.discard)(uid)
    given_uids += list(order)
    assert len(given_uids) == len(set(given_uids))


def test_candidates_test_only_the_uids_drawn() -> None:
    asked: list[str] = []

    def keep(uid: str) -> bool:
        asked.append(uid)
        return uid != "p0"

    fleet = [f"p{i}" for i in range(10_000)]
    found = Candidates(fleet, keep)
    assert found  # the first that passes ends the look
    assert asked == ["p0", "p1"]
    asked.clear()
    first = next(found.drawn(random.Random(3)))
    assert first != "p0"
    assert len(asked) <= 2
    assert list(Candidates(["p0"], keep)) == []
    assert not Candidates(["p0"], keep)
    assert not NONE
    assert list(Candidates(["a", "b"])) == ["a", "b"]


def ready(uid: str, **attributes: str) -> ProxyView:
    return ProxyView(
        uid=uid,
        phase=Phase.READY,
        url="http://127.0.0.1:3128",
        healthy=True,
        spec=ProxySpec(attributes=attributes),
    )


def test_the_index_hands_out_its_live_members_and_one_proxy_by_its_pairs() -> None:
    index = CandidateIndex()
    for uid, country in (("a", "de"), ("b", "fr"), ("c", "de")):
        index.update(ready(uid, country=country))
    live = index.to_draw({}).uids
    assert live is index.to_draw({}).uids  # not a copy per request
    assert index.to_draw({"country": "de"}).uids is index.to_draw({"country": "de"}).uids
    assert sorted(live) == ["a", "b", "c"]
    index.update(msgspec.structs.replace(ready("b", country="fr"), deleting=True))
    assert sorted(live) == ["a", "c"]  # the same object follows the index
    assert sorted(index.to_draw({"country": "de"})) == ["a", "c"]
    assert list(index.to_draw({"country": "de"}, only="c")) == ["c"]
    assert list(index.to_draw({"country": "fr"}, only="c")) == []
    assert list(index.to_draw({}, only="b")) == []  # no longer leasable
    assert list(index.to_draw({}, only="nobody")) == []


def test_a_selector_of_several_pairs_draws_from_its_rarest_pair_and_tests_the_others() -> None:
    index = CandidateIndex()
    for i in range(200):
        index.update(ready(f"p{i}", tier="gold", country="de" if i % 50 else "fr"))
    found = index.to_draw({"tier": "gold", "country": "fr"})
    assert len(found.uids) == 4  # the four French ones, not the 200 gold ones
    assert sorted(found) == ["p0", "p100", "p150", "p50"]
    assert sorted(found.drawn(random.Random(1))) == ["p0", "p100", "p150", "p50"]
    assert not index.to_draw({"tier": "gold", "country": "us"})
    both = index.to_draw({"tier": "gold", "country": "de"}).also(lambda uid: uid != "p1")
    assert "p1" not in set(both)
    assert len(list(both)) == 195
