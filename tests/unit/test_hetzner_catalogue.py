"""The pure parts of D141: the order a create walks its locations in, what the catalogue check
and the preflight say, and the catalogue cache's bounds."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from services.providers.cloud.pure.spread import spread
from services.providers.hetzner.pure.catalogue import (
    Offer,
    TypeInfo,
    fields,
    no_room,
    offered,
    type_problem,
    unknown,
    walk,
)
from services.providers.hetzner.pure.preflight import image, sizes

NOW = datetime(2026, 12, 7, tzinfo=UTC)
CX23 = TypeInfo(
    "cx23",
    "x86",
    (
        Offer("fsn1", monthly="4.1531"),
        Offer("nbg1", available=False),
        Offer("hel1", unavailable_after=datetime(2026, 1, 1, tzinfo=UTC)),
    ),
)
LOCATION = st.from_regex(r"[a-z][a-z0-9]{1,5}", fullmatch=True)


@given(st.lists(LOCATION, min_size=1, max_size=8, unique=True), st.text(max_size=40))
def test_walk_visits_each_location_once_from_the_hashed_one_in_list_order(
    locations: list[str], name: str
) -> None:
    order = walk(locations, name)
    assert sorted(order) == sorted(locations)
    assert order[0] == spread(locations, name)
    start = locations.index(order[0])
    assert order == [locations[(start + i) % len(locations)] for i in range(len(locations))]
    assert walk(locations, name) == order  # every attempt of a name asks in the same order


def test_offered_drops_a_location_past_its_deprecation_but_keeps_a_sold_out_one() -> None:
    assert offered(CX23, NOW) == ["fsn1", "nbg1"]
    assert offered(CX23, datetime(2025, 12, 31, tzinfo=UTC)) == ["fsn1", "nbg1", "hel1"]


def test_the_fields_a_message_names() -> None:
    assert fields("", "", "") == ("", "serverType")
    assert fields("fsn1", "", "cx33") == ("spec.placement.zone", "spec.placement.machineType")
    assert fields("", "ash", "") == ("spec.placement.region", "serverType")


def test_type_problem_names_the_field_and_where_the_type_would_work() -> None:
    assert (
        type_problem(CX23, ["fsn1", "nbg1"], type_field="serverType", location_field="", now=NOW)
        == ""
    )
    assert type_problem(
        CX23, ["nbg1", "hel1", "ash"], type_field="serverType", location_field="", now=NOW
    ) == (
        "serverType cx23 is not offered in hel1, ash (listed in locations); Hetzner offers it "
        "in fsn1, nbg1: list only locations that offer it, or set serverType to a type offered "
        "in every location listed"
    )
    assert type_problem(
        CX23,
        ["ash"],
        type_field="spec.placement.machineType",
        location_field="spec.placement.zone",
        now=NOW,
    ) == (
        "spec.placement.machineType cx23 is not offered in spec.placement.zone ash; Hetzner "
        "offers it in fsn1, nbg1: set spec.placement.zone to one of those, or "
        "spec.placement.machineType to a type offered in ash"
    )
    gone = TypeInfo("cx11", "x86", (Offer("fsn1", unavailable_after=NOW),))
    assert "Hetzner offers it in no location any more" in type_problem(
        gone, ["fsn1"], type_field="serverType", location_field="", now=NOW
    )
    assert type_problem(
        unknown("cx99"), ["fsn1"], type_field="serverType", location_field="", now=NOW
    ).startswith("serverType 'cx99': Hetzner has no server type of that name")


def test_no_room_says_each_answer_in_order_and_what_helps() -> None:
    tried = [
        ("nbg1", "resource_unavailable: error during placement"),
        ("fsn1", "placement_error: x"),
    ]
    assert no_room("cx23", tried, location_field="") == (
        "no capacity for server type cx23 in any location of locations, tried in this order: "
        "nbg1 (resource_unavailable: error during placement), fsn1 (placement_error: x); "
        "retried every minute: list more locations, or set serverType to a type with room"
    )
    placed = no_room("cx23", tried[:1], location_field="spec.placement.zone")
    assert "spec.placement.zone nbg1 (resource_unavailable" in placed
    assert placed.endswith("clear spec.placement.zone to let the entry's locations be tried")


def test_preflight_sizes_per_location_and_capacity() -> None:
    checks = sizes(CX23, ["fsn1", "nbg1", "hel1", "ash"], NOW)
    assert [(name, ok) for name, ok, _, _ in checks] == [
        ("size in fsn1", True),
        ("size in nbg1", True),
        ("size in hel1", False),
        ("size in ash", False),
    ]
    assert checks[0][2] == "cx23 is offered in fsn1, 4.1531 EUR a month gross"
    assert "not available now" in checks[1][2]
    (capacity,) = [c for c in sizes(CX23, ["nbg1"], NOW) if c[0] == "capacity"]
    assert not capacity[1]
    assert sizes(unknown("cx99"), ["fsn1"], NOW)[0][:2] == ("size", False)


def test_preflight_image_words() -> None:
    assert image("debian-12", "x86", (1, "system", "debian", "12"), install_squid=True)[1]
    snapshot = image("4711", "x86", (4711, "snapshot", "ubuntu", "24.04"), install_squid=True)
    assert snapshot[1]
    assert "if cloud-init is still in it" in snapshot[2]
    rocky = image("rocky-9", "x86", (2, "system", "rocky", "9"), install_squid=True)
    assert not rocky[1]
    assert rocky[3].startswith("set image to one of debian-12")
    assert image("rocky-9", "x86", (2, "system", "rocky", "9"), install_squid=False)[1]
    assert not image("nope", "arm", None, install_squid=True)[1]
