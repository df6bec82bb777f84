"""deploy/monitoring/: the alert rules pass ``promtool check rules``, the dashboard's queries are
valid PromQL, and every metric either of them names is one the services export.

The exported names come from the code, not from a list (tests/support/docgen.py): every metric
set in services/ (a class or function that takes only the ``CollectorRegistry`` it registers
on, the convention ``metric_set`` keys on) is registered on one registry, as ``up`` does, and
the registry is asked what it holds. A metric renamed in the code without the dashboard or the
rules fails here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.docgen import exported_names

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yaml"
DASHBOARD = MONITORING / "dashboard.json"

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
PROMQL_WORDS |= {"unless", "bool", "offset", "inf", "nan"}
GROUPINGS = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def promtool() -> str:
    """promtool from Debian's ``prometheus`` package (``sh deploy/host-packages.sh test``): a
    missing one fails, it is not skipped."""
    path = shutil.which("promtool")
    assert path, "promtool is missing: install it with `sh deploy/host-packages.sh test`"
    return path


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label
    matchers, ranges and groupings that are neither functions nor keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(GROUPINGS, " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        if text[match.end() :].lstrip().startswith("(") or match.group() in PROMQL_WORDS:
            continue
        names.add(match.group())
    return names


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [
        (rule.get("alert") or rule["record"], rule["expr"])
        for group in doc["groups"]
        for rule in group["rules"]
    ]


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def dashboard_exprs() -> list[tuple[str, str]]:
    return [
        (f"{panel['title']} {target['refId']}", target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def as_promql(expr: str) -> str:
    for variable, value in GRAFANA_INTERVALS.items():
        expr = expr.replace(variable, value)
    return expr


def check_rules(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )


def test_the_alert_rules_pass_promtool() -> None:
    checked = check_rules(RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    alerts = {name for name, _ in rule_exprs()}
    # What the operator asked to be woken for (docs/operations.md lists them).
    wanted_alerts = ("NoHealthyProxy", "ReplacedInALoop", "DeadLetters", "ConsumerLag", "Nats")
    for wanted in (*wanted_alerts, "DurableConsumerChanged"):
        assert any(wanted in name for name in alerts), wanted


def test_the_dashboards_queries_are_valid_promql(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{n}:check", "expr": as_promql(expr)}
        for n, (_, expr) in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = check_rules(path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_rejects_what_is_not_promql(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "a:b", "expr": "sum(("}]}]})
    )
    assert check_rules(path).returncode != 0


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_is_exported(source: str) -> None:
    exported = exported_names()
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    assert exprs
    for where, expr in exprs:
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        missing = names - exported
        assert not missing, f"{where}: {sorted(missing)} are not exported by any service"


def test_the_exported_names_come_from_every_service() -> None:
    exported = exported_names()
    for name in (
        "egress_proxies",  # discovery's fleet collector
        "egress_lease_requests_by_selector_total",  # discovery's selector metrics
        "egress_lease_acquisitions_total",  # discovery
        "egress_consumer_messages_total",  # the runtime
        "egress_nats_connected",  # the runtime's connections
        "egress_health_probes_total",  # health
        "egress_gc_sweeps_total",  # gc
        "egress_watcher_leader",  # watcher
        "egress_executor_commands_total",  # executor
    ):
        assert name in exported, name


def test_metric_names_are_found_where_promql_puts_them() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, result) (rate(a_bucket{x="y, z"}[5m] offset 1h)))'
        " / on (instance) group_left (b) max without (c) (b_total) > 1e3 and bool d"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "d"}


def test_the_dashboard_is_well_formed() -> None:
    doc = dashboard()
    ids = [panel["id"] for panel in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert doc["uid"]
    assert doc["title"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in doc["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
    shown = set().union(*(metric_names(expr) for _, expr in dashboard_exprs()))
    for wanted in (
        "egress_proxies",
        "egress_proxies_healthy",
        "egress_proxies_leased",
        "egress_proxies_available",
        "egress_lease_acquisitions_total",
        "egress_lease_requests_by_selector_total",
        "egress_dead_letters",
        "egress_consumer_pending_messages",
        "egress_nats_connected",
    ):
        assert wanted in shown, wanted
