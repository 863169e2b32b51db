"""docs/grafana/kibo.json stays built on metrics the server exports: every metric name its
PromQL expressions (panels and template variables) use is in the server's metrics registry,
so renaming a metric without the dashboard fails here; and every kibo_ metric has a panel."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kibo_ctrl.telemetry.metrics import Metrics
from prometheus_client.metrics_core import Metric

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "kibo.json"

# The sample names a family of each type exposes (prometheus_client's exposition).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created", ""),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",),
}
PROMQL_WORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
        "inf",
        "nan",
    }
)
IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def registry_names() -> set[str]:
    """Every sample name the server's registry can expose (labelled families have no samples
    until first used, so the names come from each family's type as well)."""
    names: set[str] = set()
    family: Metric
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    """The PromQL of every panel target (rows' nested panels too) and template variable."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            yield query["query"] if isinstance(query, dict) else query


def metric_names(expr: str) -> set[str]:
    """The metric names in one PromQL expression (Grafana's label_values(metric, label) too)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, regexes)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors, $__rate_interval
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"(?<![a-zA-Z0-9_:])\d[0-9.eE+-]*(?:ms|[smhdwy])*", " ", text)  # numbers, durations (5m)
    text = re.sub(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,[^)]*\)", r"\1", text)
    names = set()
    for match in IDENTIFIER.finditer(text):
        word, rest = match.group(), text[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_WORDS or text[match.start() - 1 : match.start()] == "$":
            continue  # a function or aggregation, a keyword, a Grafana variable
        names.add(word)
    return names


def unknown_names(dashboard: dict[str, Any], known: set[str]) -> dict[str, str]:
    """Each metric name the dashboard uses that the registry does not have -> its expression."""
    return {name: expr for expr in expressions(dashboard) for name in metric_names(expr) if name not in known}


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def test_every_metric_the_dashboard_uses_is_exported() -> None:
    unknown = unknown_names(load(), registry_names())
    assert not unknown, f"docs/grafana/kibo.json uses metrics the server does not export: {unknown}"


def test_every_kibo_metric_has_a_panel() -> None:
    used = {name for expr in expressions(load()) for name in metric_names(expr)}
    families = {family.name for family in Metrics().registry.collect() if family.name.startswith("kibo_")}
    missing = sorted(f for f in families if not any(name == f or name.startswith(f + "_") for name in used))
    assert not missing, f"docs/grafana/kibo.json has no panel for: {missing}"


def test_a_renamed_metric_in_a_copy_of_the_dashboard_is_caught() -> None:
    text = DASHBOARD.read_text()
    assert "kibo_store_commit_duration_seconds_bucket" in text
    copy = json.loads(
        text.replace("kibo_store_commit_duration_seconds_bucket", "kibo_store_commit_latency_seconds_bucket")
    )
    unknown = unknown_names(copy, registry_names())
    assert set(unknown) == {"kibo_store_commit_latency_seconds_bucket"}


def test_the_names_are_read_out_of_promql_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (method, le) (rate(kibo_rpc_duration_seconds_bucket{method!~"Watch.*",'
        ' code="OK"}[$__rate_interval]))) / on (node) group_left kibo_node_reachable offset 5m'
        " and label_values(kibo_workspaces, tenant) > bool 0"
    )
    assert metric_names(expr) == {"kibo_rpc_duration_seconds_bucket", "kibo_node_reachable", "kibo_workspaces"}


def test_every_panel_is_on_the_grid_with_a_unique_id_and_the_datasource_variable() -> None:
    dashboard = load()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
