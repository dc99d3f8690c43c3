"""The chart's dashboard and alert rules (charts/cpullm-operator/files), read as PromQL: every series they name is one
the operator or vLLM 0.32 serves, the dashboard's join on the labels each monitor gives them (the PodMonitor's
cpullm_service, the operator's own namespace and service), Grafana's variables are all set, and each alert's
annotations use only labels its expression keeps. e2e/test_node.py runs them against a real Prometheus scraping
real servers."""

from __future__ import annotations

import re

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram
from testbed.prometheus import ALERTS, alert_queries, dashboard_queries

from cpullm import metrics

# The vLLM 0.32 series they read (vllm/v1/metrics/loggers.py; tests/vllm/test_rendered_pod.py scrapes them).
VLLM_SERIES = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:num_preemptions_total",
    "vllm:inter_token_latency_seconds_count",
    "vllm:inter_token_latency_seconds_sum",
}
SELECTOR = re.compile(r"((?:vllm:|cpullm_)[a-z_]+)(\{[^}]*\})?")
GROUPING = re.compile(r"by \([^)]*\)")


def selectors(query: str) -> list[tuple[str, str]]:
    """(series, its label matchers) of each selector in `query`."""
    return SELECTOR.findall(GROUPING.sub("", query))


OPERATOR_WIDE = {"cpullm_services", "cpullm_reconciles_total"}  # about the operator, not one service


def operator_series() -> set[str]:
    """What the operator's registry serves, by series name."""
    names = set()
    for value in vars(metrics).values():
        if isinstance(value, Counter):
            names.add(f"{value._name}_total")
        elif isinstance(value, Histogram):
            names |= {f"{value._name}_{part}" for part in ("bucket", "sum", "count")}
        elif isinstance(value, Gauge):
            names.add(value._name)
    prediction = metrics.Prediction(1.0, 2.0, 4, 3.0, 1024)
    collectors = (
        metrics._ServicesByReadiness(lambda: {"True": 1}),
        metrics._PredictedSpeeds(lambda: {("a", "b"): prediction}),
    )
    return names | {family.name for collector in collectors for family in collector.collect()}


DASHBOARD = dashboard_queries("team-a", "chat")
ALERTING = alert_queries()


@pytest.mark.parametrize("name", [*DASHBOARD, *ALERTING])
def test_each_query_names_only_series_the_operator_or_vllm_serves(name):
    query = {**DASHBOARD, **ALERTING}[name]
    found = [metric for metric, _ in selectors(query)]
    assert found and set(found) <= VLLM_SERIES | operator_series(), (name, query)
    assert "$" not in query  # Grafana's variables, all set


@pytest.mark.parametrize("name", list(DASHBOARD))
def test_the_dashboard_joins_each_series_on_its_monitors_labels(name):
    for metric, labels in selectors(DASHBOARD[name]):
        if metric in OPERATOR_WIDE or name == "variable namespace":  # the namespace variable lists them all
            assert not labels, (name, metric)
            continue
        assert 'namespace="team-a"' in labels, (name, metric)
        if name != "variable service":  # which lists the namespace's services
            service = 'cpullm_service="chat"' if metric.startswith("vllm:") else 'service="chat"'
            assert service in labels, (name, metric)


def test_each_alerts_annotations_use_only_the_labels_its_expression_keeps():
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            kept = re.search(r"by \(([^)]*)\)", rule["expr"])
            if kept:
                labels = {label.strip() for label in kept.group(1).split(",")}
            elif rule["expr"].startswith("sum("):
                labels = set()
            else:  # a plain selector keeps its series' labels
                labels = {"namespace", "service"} if "speed_share" in rule["expr"] else {"ready"}
            used = set(re.findall(r"\$labels\.([a-z_]+)", " ".join(rule["annotations"].values())))
            assert used <= labels, (rule["alert"], used, labels)
            assert rule["labels"]["severity"] == "warning" and rule["for"]
