"""The NetworkPolicies of a service (spec.networkPolicy): the servers admit only their router in router mode, and
what allowedFrom names (by default their own namespace) otherwise; the router admits allowedFrom; metricsFrom may
scrape both. Ingress only: the servers still reach the Hub. The kubelet's probes come from the node, which
NetworkPolicy always admits."""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec, NetworkPolicyPeer
from cpullm.core.children.common import Owner, metadata, selector
from cpullm.core.children.router import HEALTH_PORT, router_name, router_selector, uses_router

NETWORK_POLICY_API_VERSION = "networking.k8s.io/v1"
THE_NAMESPACE: list[dict[str, Any]] = [{"podSelector": {}}]  # every pod of the policy's own namespace


def _peers(peers: list[NetworkPolicyPeer]) -> list[dict[str, Any]]:
    return [peer.model_dump(by_alias=True, exclude_defaults=True) for peer in peers]


def _allowed(spec: CpuLLMServiceSpec) -> list[dict[str, Any]]:
    allowed = spec.network_policy.allowed_from
    return THE_NAMESPACE if allowed is None else _peers(allowed)


def _policy(
    name: str, owner: Owner, pods: dict[str, str], rules: list[tuple[list[dict[str, Any]], int]]
) -> dict[str, Any]:
    """Ingress to `pods` only from each rule's peers on its port (a rule without peers admits nothing)."""
    ingress = [{"from": peers, "ports": [{"protocol": "TCP", "port": port}]} for peers, port in rules if peers]
    return {
        "apiVersion": NETWORK_POLICY_API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": {**metadata(owner), "name": name},
        "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def build_servers_network_policy(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    if not spec.network_policy.enabled:
        return None
    callers = [{"podSelector": {"matchLabels": router_selector(owner)}}] if uses_router(plan) else _allowed(spec)
    port = spec.service.port
    return _policy(
        owner.name, owner, selector(owner), [(callers, port), (_peers(spec.network_policy.metrics_from), port)]
    )


def build_router_network_policy(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    if not spec.network_policy.enabled or not uses_router(plan):
        return None
    rules = [(_allowed(spec), spec.service.port), (_peers(spec.network_policy.metrics_from), HEALTH_PORT)]
    return _policy(router_name(owner), owner, router_selector(owner), rules)


def admit_operator(children: list[dict[str, Any]], owner: Owner, port: int, peer: NetworkPolicyPeer | None) -> None:
    """The servers' NetworkPolicy among `children` also admits the operator's pods (`peer`, the admin's setting) on
    their API port, where the performance check reads /metrics (controller/performance.py); None: nothing added."""
    if peer is None:
        return
    for child in children:
        if child["kind"] == "NetworkPolicy" and child["metadata"]["name"] == owner.name:
            child["spec"]["ingress"].append({"from": _peers([peer]), "ports": [{"protocol": "TCP", "port": port}]})
