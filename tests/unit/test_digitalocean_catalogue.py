"""DigitalOcean's size catalogue read as "can this size be made in this region", and the
messages that say where it could: pure tables (D142)."""

from __future__ import annotations

import pytest

from services.providers.digitalocean.pure.catalogue import (
    MAX_SIZES,
    offered_in,
    size_of,
    size_problem,
    sizes_of,
)

CATALOGUE = sizes_of(
    [
        {
            "slug": "s-1vcpu-512mb-10gb",
            "price_monthly": 4.0,
            "regions": ["ams3", "fra1"],
            "available": True,
        },
        {
            "slug": "s-1vcpu-1gb",
            "price_monthly": 6.0,
            "regions": ["ams3", "fra1", "lon1"],
            "available": True,
        },
        {"slug": "s-2vcpu-4gb", "price_monthly": 24.0, "regions": ["lon1"], "available": True},
        {"slug": "s-3vcpu-1gb", "price_monthly": 15.0, "regions": [], "available": False},
        {"slug": "c-2", "price_monthly": 42.0, "regions": ["lon1"], "available": False},
    ]
)


def test_a_size_offered_in_the_region_is_fine() -> None:
    assert size_problem(CATALOGUE, "s-1vcpu-512mb-10gb", "fra1", "size") == ""


def test_a_size_outside_the_region_names_the_field_and_the_regions_where_it_works() -> None:
    problem = size_problem(CATALOGUE, "s-1vcpu-512mb-10gb", "lon1", "size")
    assert problem == (
        "size 's-1vcpu-512mb-10gb' is not offered in region lon1 (DigitalOcean offers it in "
        "ams3, fra1); use one of those regions, or a size offered in lon1 such as "
        "s-1vcpu-1gb, s-2vcpu-4gb"
    )


@pytest.mark.parametrize(
    ("size", "said"),
    [
        ("s-64vcpu-1tb", "spec.placement.machineType 's-64vcpu-1tb' is not a DigitalOcean"),
        ("s-3vcpu-1gb", "is not offered for new Droplets in any region any more"),
        ("c-2", "is not offered for new Droplets in any region any more"),
    ],
)
def test_unknown_and_retired_sizes_propose_the_cheapest_offered(size: str, said: str) -> None:
    problem = size_problem(CATALOGUE, size, "ams3", "spec.placement.machineType")
    assert said in problem
    assert problem.endswith("use a size offered in ams3 such as s-1vcpu-512mb-10gb, s-1vcpu-1gb")


def test_a_region_no_size_is_offered_in_says_so() -> None:
    assert "DigitalOcean lists no size for xyz9" in size_problem(
        CATALOGUE, "s-1vcpu-1gb", "xyz9", "size"
    )


def test_offers_are_cheapest_first_and_only_available_ones() -> None:
    assert offered_in(CATALOGUE, "lon1") == ["s-1vcpu-1gb", "s-2vcpu-4gb"]


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "s-1vcpu-1gb",
        {},
        {"slug": ""},
        {"slug": 7},
    ],
)
def test_an_item_without_a_slug_is_no_size(raw: object) -> None:
    assert size_of(raw) is None


def test_unreadable_fields_count_against_the_size() -> None:
    size = size_of({"slug": "x", "available": "yes", "regions": "ams3", "price_monthly": True})
    assert size is not None
    assert (size.available, size.regions, size.price_monthly) == (False, frozenset(), 0.0)
    assert "is not offered for new Droplets" in size_problem({"x": size}, "x", "ams3", "size")


def test_what_is_kept_of_an_answer_is_bounded() -> None:
    many = [{"slug": f"s-{n}", "available": True, "regions": ["ams3"]} for n in range(5000)]
    assert len(sizes_of(many)) == MAX_SIZES
