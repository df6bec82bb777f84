"""`bench compare`'s judgement: where each figure is read, which way is worse, and what a
missing or unusable figure does (nothing: it is shown as n/a, never a regression)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.compare_figures import BENCHES, BY_NAME, Figure, Verdict, judge, read

LOWER = Figure("cpu", ("summary", "cpu", 0), "lower")
HIGHER = Figure("rate", ("rate",), "higher")


def test_a_figure_is_read_where_its_path_says() -> None:
    doc = {"summary": {"cpu": [120.0, 100.0, 140.0]}, "rate": 7}
    assert read(doc, LOWER) == 120.0
    assert read(doc, HIGHER) == 7.0


@pytest.mark.parametrize(
    "doc",
    [{}, {"summary": {}}, {"summary": {"cpu": []}}, {"summary": {"cpu": ["x"]}}, {"summary": 3}],
    ids=["empty", "no key", "empty list", "not a number", "not a mapping"],
)
def test_a_figure_the_document_lacks_is_none(doc: dict[str, Any]) -> None:
    assert read(doc, LOWER) is None


def test_a_boolean_is_no_figure() -> None:
    assert read({"rate": True}, HIGHER) is None


def test_lifecycle_cpu_per_proxy_is_every_process_per_proxy() -> None:
    [cpu, _] = BY_NAME["lifecycle"].figures
    doc = {"config": {"proxies": 1000}, "summary": {"k1": {"cpu_seconds": {"a": 1.5, "b": 2.5}}}}
    assert read(doc, cpu) == pytest.approx(4.0)
    assert read({"config": {"proxies": 0}, "summary": doc["summary"]}, cpu) is None


@pytest.mark.parametrize(
    ("better", "base", "head", "regression"),
    [
        ("lower", [100.0], [111.0], True),
        ("lower", [100.0], [109.0], False),
        ("lower", [100.0], [50.0], False),
        ("higher", [100.0], [89.0], True),
        ("higher", [100.0], [91.0], False),
        ("higher", [100.0], [200.0], False),
        ("lower", [], [100.0], False),
        ("lower", [0.0], [100.0], False),
    ],
)
def test_a_regression_is_more_than_a_tenth_the_wrong_way(
    better: str, base: list[float], head: list[float], regression: bool
) -> None:
    verdict = Verdict("b", "f", "lower" if better == "lower" else "higher", base, head)
    assert verdict.regression is regression


def test_the_medians_of_the_rounds_are_compared() -> None:
    verdict = Verdict("b", "f", "lower", [100.0, 300.0, 110.0], [105.0, 90.0, 1000.0])
    assert verdict.change == pytest.approx(105 / 110 - 1)
    assert not verdict.regression


def test_judge_gives_every_figure_a_verdict_even_without_values() -> None:
    bench = BY_NAME["health"]
    base = [{"cpu_us_per_probe": 100.0, "probes_per_second": 50.0}]
    head = [{"cpu_us_per_probe": 130.0}]
    verdicts = judge(bench, base, head)
    assert [(v.figure, v.regression) for v in verdicts] == [
        ("CPU µs per probe", True),
        ("probes/s", False),
    ]
    assert verdicts[1].head == []


def test_every_bench_names_a_module_its_figures_and_a_quick_run() -> None:
    for bench in BENCHES:
        assert bench.module == f"bench.{bench.name}"
        assert bench.figures
        assert bench.quick
        assert "--json" not in bench.arguments + bench.quick  # the runner adds it
