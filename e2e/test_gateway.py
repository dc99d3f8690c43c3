"""CpuLLMGateway against the real API server and the operator: its CRD's admission checks, the children it renders
(owned by the gateway, under the chart's write policy on kind), its status following the services it fronts, a
same-name object someone else made left untouched, a child deleted by someone else made again, and the children
gone with the gateway. What the gateway's HAProxy does with requests is e2e/test_gateway_proxy.py's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from testbed.objects import tiny_service
from testbed.operator import InClusterOperator, Operator
from testbed.tools import Kubectl, eventually

from e2e.support import NodePool, pool

GATEWAY_CHILDREN = ("configmap", "deployment", "service", "networkpolicy", "poddisruptionbudget")


def gateway(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body = {
        "services": ["chat", "code"],
        "teams": [
            {"name": "team-a", "keySecret": {"name": "team-a-key"}, "models": ["chat-lora"], "requestsPerMinute": 60},
            {"name": "team-b", "keySecret": {"name": "team-b-key"}, "priority": 10},
        ],
        **spec,
    }
    return {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMGateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def status_of(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return (kubectl.get("cpullmgateway", name, namespace) or {}).get("status") or {}


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def test_a_gateway_routes_its_services_models_and_follows_them(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    kubectl.apply(tiny_service("chat", namespace, adapters=[{"name": "chat-lora", "source": "org/lora", "rank": 8}]))
    kubectl.apply(gateway("front", namespace))

    def routed_one() -> dict[str, Any]:
        status = status_of(kubectl, namespace, "front")
        assert condition(status, "Routed").get("reason") == "ServicesMissing", status
        return status

    status = eventually(routed_one, timeout=60, what="the gateway's status")
    assert "service code not found" in condition(status, "Routed")["message"]
    model = tiny_service("chat", namespace)["spec"]["model"]["name"]
    assert status["routes"] == sorted(
        [{"model": model, "service": "chat"}, {"model": "chat-lora", "service": "chat"}], key=lambda r: r["model"]
    )
    assert status["endpoint"] == f"http://front-gateway.{namespace}.svc.cluster.local:8000"
    for kind in GATEWAY_CHILDREN:
        child = kubectl.get(kind, "front-gateway", namespace)
        assert child is not None, kind
        refs = child["metadata"]["ownerReferences"]
        assert [(r["kind"], r["name"], r["controller"]) for r in refs] == [("CpuLLMGateway", "front", True)]
    config = kubectl.get("configmap", "front-gateway", namespace)["data"]
    assert config["grants.map"].splitlines() == sorted(
        ["team-a/chat-lora 1", "team-b/chat-lora 1", f"team-b/{model} 1"]
    )
    assert f"chat.{namespace}.svc.cluster.local:8000" in config["haproxy.cfg"]
    pod = kubectl.get("deployment", "front-gateway", namespace)["spec"]["template"]["spec"]
    assert [s["secret"]["name"] for s in pod["volumes"][1]["projected"]["sources"]] == ["team-a-key", "team-b-key"]

    # The second service appears: its model is routed, the condition turns.
    coder = {**tiny_service("code", namespace)["spec"]["model"], "name": "org/coder"}  # the same shape, its own name
    kubectl.apply(tiny_service("code", namespace, model=coder))

    def routed_both() -> dict[str, Any]:
        status = status_of(kubectl, namespace, "front")
        assert condition(status, "Routed").get("status") == "True", status
        return status

    status = eventually(routed_both, timeout=60, what="both services routed")
    assert {"model": "org/coder", "service": "code"} in status["routes"]
    assert "org/coder svc-code" in kubectl.get("configmap", "front-gateway", namespace)["data"]["models.map"]


def test_a_gateway_never_takes_over_and_puts_back_what_was_deleted(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "front-gateway", "namespace": namespace},
            "data": {"mine": "yes"},
        }
    )
    kubectl.apply(gateway("front", namespace, replicas=1))

    def conflict() -> dict[str, Any]:
        ready = condition(status_of(kubectl, namespace, "front"), "Ready")
        assert ready.get("reason") == "Conflict", ready
        return ready

    ready = eventually(conflict, timeout=60, what="the conflict reported")
    assert "ConfigMap" in ready["message"] and "not controlled by this CpuLLMGateway" in ready["message"]
    assert kubectl.get("configmap", "front-gateway", namespace)["data"] == {"mine": "yes"}
    assert kubectl.get("deployment", "front-gateway", namespace) is None

    kubectl.run("delete", "configmap", "front-gateway", "-n", namespace)
    kubectl.run(
        "patch", "cpullmgateway", "front", "-n", namespace, "--type=merge", "-p", json.dumps({"spec": {"port": 8001}})
    )
    eventually(lambda: kubectl.get("deployment", "front-gateway", namespace) is not None, timeout=60, what="applied")
    assert kubectl.get("poddisruptionbudget", "front-gateway", namespace) is None  # one replica: no budget

    uid = kubectl.get("service", "front-gateway", namespace)["metadata"]["uid"]
    kubectl.run("delete", "service", "front-gateway", "-n", namespace)  # someone deletes it: it comes back

    def made_again() -> bool:
        service = kubectl.get("service", "front-gateway", namespace)
        assert service is not None and service["metadata"]["uid"] != uid, service
        return bool(service["spec"]["ports"][0]["port"] == 8001)

    eventually(made_again, timeout=60, what="the Service made again")


def test_a_service_whose_allowed_from_narrows_its_callers_admits_the_gateways_in_front_of_it(
    kubectl: Kubectl, operator: Operator | InClusterOperator, nodes: NodePool, namespace: str
):
    """Its NetworkPolicy gains the gateway's pods when a gateway lists it, and loses them when the gateway goes (the
    operator's own pods, which the chart's performance check has the servers admit, aside)."""
    kubectl.apply(
        tiny_service("code", namespace, nodeSelector=pool(nodes, namespace, 1), networkPolicy={"allowedFrom": []})
    )
    front = {"podSelector": {"matchExpressions": [{"key": "cpullm.io/gateway", "operator": "In", "values": ["front"]}]}}

    def gateways() -> list[Any]:
        policy = kubectl.get("networkpolicy", "code", namespace)
        assert policy is not None, "the service's NetworkPolicy"
        peers = [peer for rule in policy["spec"].get("ingress") or [] for peer in rule["from"]]
        return [peer for peer in peers if "cpullm.io/gateway" in json.dumps(peer)]

    eventually(lambda: gateways() == [], timeout=60, what="the service planned, admitting no gateway")
    kubectl.apply(gateway("front", namespace))
    eventually(lambda: gateways() == [front], timeout=60, what="the gateway's pods admitted")
    kubectl.run("delete", "cpullmgateway", "front", "-n", namespace)
    eventually(lambda: gateways() == [], timeout=60, what="the gateway's pods no longer admitted")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"services": []}, "spec.services"),
        (
            {"teams": [{"name": "a", "keySecret": {"name": "k"}}, {"name": "a", "keySecret": {"name": "j"}}]},
            "Duplicate",
        ),
        ({"teams": [{"name": "Team", "keySecret": {"name": "k"}}]}, "spec.teams[0].name"),
        ({"maxRequestBytes": 1}, "spec.maxRequestBytes"),
    ],
)
def test_the_api_server_refuses_a_bad_gateway(kubectl: Kubectl, namespace: str, spec: dict[str, Any], message: str):
    refused = kubectl.run("apply", "-f", "-", input=json.dumps(gateway("bad", namespace, **spec)), check=False)
    assert refused.returncode != 0 and message in refused.stderr, refused.stderr
