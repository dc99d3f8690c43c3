"""spec.routing against the real API server: the router's children and the Service that selects them, following
the routing as it changes; the PodDisruptionBudget; the InferencePool and its HTTPRoute with the real Gateway API
Inference Extension and Gateway API CRDs (from their Go modules, scripts/fetch-crds.sh), the Routing condition while
a CRD is missing, and what goes when the routing changes. Requests through a real router to real servers are
e2e/test_router_traffic.py's (kind)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed.objects import tiny_service
from testbed.operator import InClusterOperator, Operator
from testbed.tools import Kubectl, eventually, free_port

from e2e.support import condition, conditions, install, owned_by_service

INFERENCEPOOL_CRD = "inferencepools.inference.networking.k8s.io"
HTTPROUTE_CRD = "httproutes.gateway.networking.k8s.io"


def patch(kubectl: Kubectl, namespace: str, name: str, spec: dict[str, Any]) -> None:
    kubectl.run("patch", "cpullm", name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec}))


def gone(kubectl: Kubectl, kind: str, name: str, namespace: str) -> None:
    eventually(lambda: kubectl.get(kind, name, namespace) is None, timeout=60, what=f"{kind} {name} deleted")


def test_the_router_and_its_service_follow_the_routing(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    kubectl.apply(tiny_service("spread", namespace, placement="throughput", replicas=2, maxNumSeqs=4))

    def reported() -> dict[str, Any]:
        # The status is patched after every child is written: once it shows the router, so does the cluster.
        status = (kubectl.get("cpullm", "spread", namespace) or {}).get("status", {})
        assert status.get("plan", {}).get("routing") == "router", status
        return status

    status = eventually(reported, timeout=60, what="the plan routed through the router")
    assert status["optionalChildren"] == [
        "NetworkPolicy",  # spec.networkPolicy, on by default: the servers', then the router's
        "NetworkPolicy/spread-router",
        "ConfigMap/spread-router",
        "PodDisruptionBudget",
        "Service/spread-servers",
        "Deployment/spread-router",
    ]
    assert owned_by_service(kubectl.get("deployment", "spread-router", namespace), "spread")
    config = kubectl.get("configmap", "spread-router", namespace)
    assert owned_by_service(config, "spread")
    assert "  balance leastconn" in config["data"]["haproxy.cfg"].splitlines()
    assert f"spread-servers.{namespace}.svc.cluster.local:8000" in config["data"]["haproxy.cfg"]
    servers = kubectl.get("service", "spread-servers", namespace)
    assert (servers["spec"]["clusterIP"], servers["spec"]["selector"]) == ("None", {"cpullm.io/service": "spread"})
    assert kubectl.get("service", "spread", namespace)["spec"]["selector"] == {"cpullm.io/router": "spread"}
    budget = kubectl.get("poddisruptionbudget", "spread", namespace)
    assert owned_by_service(budget, "spread") and budget["spec"]["maxUnavailable"] == 1

    # Through the Service instead: the router's children go, the Service selects the servers again.
    patch(kubectl, namespace, "spread", {"routing": {"mode": "service"}})
    for kind, name in (("deployment", "spread-router"), ("configmap", "spread-router"), ("service", "spread-servers")):
        gone(kubectl, kind, name, namespace)
    # Awaited too: the deletions observed say nothing of when the Service was written.
    eventually(
        lambda: kubectl.get("service", "spread", namespace)["spec"]["selector"] == {"cpullm.io/service": "spread"},
        timeout=60,
        what="the Service selecting the servers again",
    )
    assert kubectl.get("deployment", "spread", namespace) is not None  # the servers stay

    # One server: no disruption budget.
    patch(kubectl, namespace, "spread", {"replicas": 1})
    gone(kubectl, "poddisruptionbudget", "spread", namespace)
    eventually(
        lambda: kubectl.get("cpullm", "spread", namespace)["status"]["optionalChildren"] == ["NetworkPolicy"],
        timeout=60,
        what="nothing optional left but the servers' NetworkPolicy",
    )


def test_the_inference_pool_waits_for_its_crds_then_is_applied_owned_and_removed(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, crd_files: dict[str, str]
):
    if kubectl.get("crd", INFERENCEPOOL_CRD) is not None or kubectl.get("crd", HTTPROUTE_CRD) is not None:
        pytest.skip("this cluster already has the InferencePool or HTTPRoute CRD: the 'missing' half cannot be shown")
    pool = {"endpointPicker": "pooled-epp", "gateway": "inference-gateway"}
    kubectl.apply(tiny_service("pooled", namespace, routing={"mode": "inferencePool", "inferencePool": pool}))
    missing = condition(kubectl, namespace, "pooled", "Routing", "False", "InferencePoolCRDMissing")
    assert INFERENCEPOOL_CRD in missing["message"]

    install(kubectl, crd_files["INFERENCEPOOL_CRD"], INFERENCEPOOL_CRD)
    missing = condition(kubectl, namespace, "pooled", "Routing", "False", "HTTPRouteCRDMissing")
    assert HTTPROUTE_CRD in missing["message"]
    found = kubectl.get("inferencepool", "pooled", namespace)
    assert owned_by_service(found, "pooled")
    assert found["spec"]["selector"] == {"matchLabels": {"cpullm.io/service": "pooled"}}
    assert found["spec"]["endpointPickerRef"]["name"] == "pooled-epp"

    install(kubectl, crd_files["HTTPROUTE_CRD"], HTTPROUTE_CRD)
    applied = condition(kubectl, namespace, "pooled", "Routing", "True", "InferencePoolApplied")
    assert applied["message"] == "InferencePool pooled; HTTPRoute pooled"
    route = kubectl.get("httproute", "pooled", namespace)
    assert owned_by_service(route, "pooled")
    assert route["spec"]["parentRefs"][0]["name"] == "inference-gateway"
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"][0]["kind"] == "InferencePool" and rule["backendRefs"][0]["name"] == "pooled"
    status = kubectl.get("cpullm", "pooled", namespace)["status"]
    assert status["optionalChildren"] == ["NetworkPolicy", "InferencePool", "HTTPRoute"]

    # Routed through the Service again: the pool and its route go, and so does the condition.
    patch(kubectl, namespace, "pooled", {"routing": {"mode": "service"}})
    gone(kubectl, "httproute", "pooled", namespace)
    gone(kubectl, "inferencepool", "pooled", namespace)
    eventually(
        lambda: "Routing" not in conditions(kubectl.get("cpullm", "pooled", namespace)),
        timeout=60,
        what="Routing condition gone",
    )


RESYNC_SECONDS = 5


@pytest.fixture
def resyncing_operator(kubectl: Kubectl, operator: Operator | InClusterOperator, workdir: Path) -> Iterator[Operator]:
    """The suite's operator stopped and one started in its place that lists its children every 5 s (default 300)."""
    assert isinstance(operator, Operator), "a test of a local operator process is marked local_operator"
    operator.stop()
    resyncing = Operator(
        kubectl.kubeconfig,
        workdir / "operator-resync.log",
        free_port(),
        env={"CPULLM_RESYNC_SECONDS": str(RESYNC_SECONDS)},
    )
    try:
        resyncing.start()
        yield resyncing
    finally:
        resyncing.stop()
        operator.start()


@pytest.mark.local_operator
def test_what_is_not_watched_is_applied_again_after_another_writer_changes_or_deletes_it(
    kubectl: Kubectl, resyncing_operator: Operator, namespace: str, crd_files: dict[str, str]
):
    """No watch tells of an InferencePool or a PodDisruptionBudget: the resync's listing finds the edit and the
    deletion, and the next reconcile applies them again."""
    if kubectl.get("crd", INFERENCEPOOL_CRD) is None:
        install(kubectl, crd_files["INFERENCEPOOL_CRD"], INFERENCEPOOL_CRD)
    routing = {"mode": "inferencePool", "inferencePool": {"endpointPicker": "drift-epp"}}
    kubectl.apply(tiny_service("drift", namespace, replicas=2, routing=routing))
    condition(kubectl, namespace, "drift", "Routing", "True", "InferencePoolApplied")
    assert kubectl.get("poddisruptionbudget", "drift", namespace) is not None
    edit = {"spec": {"targetPorts": [{"number": 9999}]}}
    kubectl.run("patch", "inferencepool", "drift", "-n", namespace, "--type=merge", "-p", json.dumps(edit))
    kubectl.run("delete", "poddisruptionbudget", "drift", "-n", namespace)

    def reverted() -> bool:
        pool = kubectl.get("inferencepool", "drift", namespace)
        assert pool["spec"]["targetPorts"] == [{"number": 8000}], pool["spec"]
        return kubectl.get("poddisruptionbudget", "drift", namespace) is not None

    eventually(reverted, timeout=RESYNC_SECONDS * 6, what="the InferencePool reverted and the budget back")
