"""Metrics and autoscaling against the real API server: the operator's own metrics endpoint, the PodMonitor,
HorizontalPodAutoscaler and KEDA ScaledObject children with the real Prometheus Operator and KEDA CRDs (from
their Go modules, scripts/fetch-crds.sh), the conditions while a CRD is missing, and replicas flowing from a
write on the CpuLLMService's scale subresource (what an HPA does) into the Deployment."""

from __future__ import annotations

import json

import pytest
from testbed.objects import tiny_service
from testbed.operator import InClusterOperator, Operator
from testbed.tools import Kubectl, eventually, scrape

from e2e.support import condition, conditions, install, not_planned, owned_by_service, ready

PODMONITOR_CRD = "podmonitors.monitoring.coreos.com"
SCALEDOBJECT_CRD = "scaledobjects.keda.sh"


def test_podmonitor_waits_for_its_crd_then_is_applied_and_owned(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, crd_files: dict[str, str]
):
    if kubectl.get("crd", PODMONITOR_CRD) is not None:
        pytest.skip("this cluster already has the PodMonitor CRD: the 'missing' half cannot be shown")
    kubectl.apply(tiny_service("watched", namespace, monitoring={"podMonitor": True, "interval": "15s"}))
    ready(kubectl, namespace, "watched", 1)  # the servers do not wait for monitoring
    missing = condition(kubectl, namespace, "watched", "Monitoring", "False", "PodMonitorCRDMissing")
    assert PODMONITOR_CRD in missing["message"]

    install(kubectl, crd_files["PODMONITOR_CRD"], PODMONITOR_CRD)
    condition(kubectl, namespace, "watched", "Monitoring", "True", "PodMonitorApplied")
    monitor = kubectl.get("podmonitor", "watched", namespace)
    assert owned_by_service(monitor, "watched")
    assert monitor["spec"]["selector"] == {"matchLabels": {"cpullm.io/service": "watched"}}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http", "/metrics", "15s")
    assert kubectl.get("cpullm", "watched", namespace)["status"]["optionalChildren"] == ["NetworkPolicy", "PodMonitor"]

    # The spec stops asking: the PodMonitor is deleted and the condition goes.
    kubectl.run("patch", "cpullm", "watched", "-n", namespace, "--type=merge", "-p", '{"spec":{"monitoring":null}}')
    eventually(lambda: kubectl.get("podmonitor", "watched", namespace) is None, timeout=60, what="PodMonitor deleted")
    eventually(
        lambda: "Monitoring" not in conditions(kubectl.get("cpullm", "watched", namespace)),
        timeout=60,
        what="Monitoring condition gone",
    )


def test_hpa_then_keda_scaledobject_target_the_services_scale_subresource(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, crd_files: dict[str, str]
):
    autoscaling = {"minReplicas": 1, "maxReplicas": 3, "targetWaitingRequests": 4, "maxKvCacheUsage": 0.9}
    kubectl.apply(tiny_service("scaled-auto", namespace, autoscaling=autoscaling))
    ready(kubectl, namespace, "scaled-auto", 1)
    condition(kubectl, namespace, "scaled-auto", "Autoscaling", "True", "HorizontalPodAutoscalerApplied")
    hpa = kubectl.get("hpa", "scaled-auto", namespace)
    assert owned_by_service(hpa, "scaled-auto")
    target = {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService", "name": "scaled-auto"}
    assert hpa["spec"]["scaleTargetRef"] == target
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)
    metrics = [(m["pods"]["metric"]["name"], m["pods"]["target"]["averageValue"]) for m in hpa["spec"]["metrics"]]
    assert metrics == [("vllm_num_requests_waiting", "4"), ("vllm_kv_cache_usage_perc", "900m")]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 900

    if kubectl.get("crd", SCALEDOBJECT_CRD) is None:
        install(kubectl, crd_files["SCALEDOBJECT_CRD"], SCALEDOBJECT_CRD)
    keda = {**autoscaling, "kind": "keda", "prometheusAddress": "http://prometheus.monitoring:9090"}
    patch = json.dumps({"spec": {"autoscaling": keda}})
    kubectl.run("patch", "cpullm", "scaled-auto", "-n", namespace, "--type=merge", "-p", patch)
    condition(kubectl, namespace, "scaled-auto", "Autoscaling", "True", "ScaledObjectApplied")
    scaled = kubectl.get("scaledobject", "scaled-auto", namespace)
    assert owned_by_service(scaled, "scaled-auto") and scaled["spec"]["scaleTargetRef"] == target
    queue = scaled["spec"]["triggers"][0]["metadata"]
    assert queue["query"] == f'sum(vllm:num_requests_waiting{{namespace="{namespace}",cpullm_service="scaled-auto"}})'
    eventually(lambda: kubectl.get("hpa", "scaled-auto", namespace) is None, timeout=60, what="the HPA deleted")
    # maxReplicas 3: the servers have a PodDisruptionBudget too.
    assert kubectl.get("cpullm", "scaled-auto", namespace)["status"]["optionalChildren"] == [
        "NetworkPolicy",
        "PodDisruptionBudget",
        "ScaledObject",
    ]


def test_a_write_on_the_scale_subresource_reaches_the_deployment(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    """What an HPA or KEDA does: it writes the CpuLLMService's /scale, the operator carries it to the Deployment."""
    kubectl.apply(tiny_service("hpa-write", namespace))
    ready(kubectl, namespace, "hpa-write", 1)
    body = json.dumps({"spec": {"replicas": 2}})
    kubectl.run("patch", "cpullm", "hpa-write", "-n", namespace, "--subresource=scale", "--type=merge", "-p", body)
    ready(kubectl, namespace, "hpa-write", 2)
    assert kubectl.get("deployment", "hpa-write", namespace)["spec"]["replicas"] == 2


@pytest.mark.local_operator  # the in-cluster operator's metrics are behind its Service
def test_operator_metrics_count_reconciles_refusals_and_services(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    assert isinstance(operator, Operator) and operator.metrics_url is not None
    kubectl.apply(tiny_service("counted", namespace))
    ready(kubectl, namespace, "counted", 1)
    kubectl.apply(tiny_service("refused-m", namespace, cpu={"requiredISA": ["avx10_2"]}))  # no node has it
    # The counters are the process's: an earlier test's refusal may already be counted, so this one's is awaited.
    not_planned(kubectl, namespace, "refused-m", "NoEligibleNode")

    def scraped() -> dict[str, float]:
        samples = scrape(operator.metrics_url, timeout=5)
        assert samples.get('cpullm_plan_refusals_total{reason="NoEligibleNode"}', 0) >= 1, "no refusal yet"
        # The readiness gauge is the operator's memory of the status it wrote, kept just after the write.
        assert samples.get('cpullm_services{ready="False"}', 0) >= 1, "no service reported not ready yet"
        return samples

    samples = eventually(scraped, timeout=60, what="metrics with a refusal and a service not ready")
    assert samples['cpullm_reconciles_total{outcome="planned"}'] >= 1
    assert samples['cpullm_services{ready="True"}'] >= 1
    assert samples["cpullm_node_profiles"] >= 1
    assert samples['cpullm_reconcile_duration_seconds_count{outcome="planned"}'] >= 1
