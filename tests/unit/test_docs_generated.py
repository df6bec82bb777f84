"""The lists the docs copy from the code are generated from it and fail here while stale
(tests/support/docgen.py): the event types in docs/architecture.md, from the union, and the
metrics in docs/operations.md, from what the services register; and a metric the Metrics
section names in its prose is one the code exports."""

from __future__ import annotations

import re

import pytest

from events.schemas import EVENT_TYPES
from tests.support.docgen import (
    OPERATIONS,
    begin,
    current,
    end,
    event_table,
    exported,
    exported_names,
    render,
)


@pytest.mark.parametrize("name", ["event types", "metrics", "service settings"])
def test_the_generated_block_is_current(name: str) -> None:
    text, wanted = current(name)
    assert text == wanted, f"the '{name}' block is stale: python -m tests.support.docgen"


def test_the_event_table_names_every_type_of_the_union_once() -> None:
    named = re.findall(r"^\| `(\w+)` \|", event_table(), re.M)
    assert sorted(named) == sorted(EVENT_TYPES)
    assert len(named) == len(EVENT_TYPES) == 39


def test_the_metric_table_names_every_exported_family() -> None:
    families = exported()
    assert len(families) > 70
    text, _ = current("metrics")
    block = text.split(begin("metrics"), 1)[1].split(end("metrics"), 1)[0]
    for family in families:
        assert f"| `{family.shown}` |" in block, family.shown


def metrics_section() -> str:
    text = OPERATIONS.read_text()
    section = text.split("\n## Metrics", 1)[1].split("\n## ", 1)[0]
    return section.split(begin("metrics"), 1)[0] + section.split(end("metrics"), 1)[1]


def test_every_metric_the_prose_names_is_exported() -> None:
    names = exported_names()
    cited = set(re.findall(r"`(egress_[a-z_*]+)`", metrics_section()))
    assert cited, "the Metrics section names no metric"
    for name in sorted(cited):
        pattern = re.compile(re.escape(name).replace(r"\*", "[a-z_]+") + r"\Z")
        assert any(pattern.match(n) for n in names), (
            f"docs/operations.md names {name}: not exported"
        )


def test_a_stale_block_is_found_and_a_missing_marker_named() -> None:
    stale = f"a\n{begin('x')}\nold\n{end('x')}\nb"
    assert render(stale, "x", "new") == f"a\n{begin('x')}\nnew\n{end('x')}\nb"
    with pytest.raises(ValueError, match="markers of 'y'"):
        render(stale, "y", "new")
