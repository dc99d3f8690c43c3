"""The NetworkPolicies of a service (spec.networkPolicy): the servers admit only their router in router mode, and
what allowedFrom names (by default their own namespace) otherwise; the router admits allowedFrom; metricsFrom may
scrape both. The servers reach DNS, HTTPS outside the private ranges (the Hub) and egressTo (spec.networkPolicy.egress,
on by default): a server that runs a tenant's code (a model's remote code, an image of theirs) cannot reach the
cluster's pods, Services, nodes or a cloud's metadata address. The kubelet's probes come from the node, which
NetworkPolicy always admits; the router's egress is not limited (it reaches the servers)."""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec, NetworkPolicyPeer
from cpullm.core.children.common import Owner, metadata, selector
from cpullm.core.children.router import HEALTH_PORT, router_name, router_selector, uses_router

NETWORK_POLICY_API_VERSION = "networking.k8s.io/v1"
THE_NAMESPACE: list[dict[str, Any]] = [{"podSelector": {}}]  # every pod of the policy's own namespace
# Addresses a server's HTTPS may not reach (RFC 1918 private, RFC 6598 shared, link-local with clouds' metadata
# 169.254.169.254, loopback, and IPv6's unique-local, link-local and loopback): where clusters keep their pods,
# Services and nodes. Everything else on 443 is the Hub and its CDN.
PRIVATE_V4 = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"]
PRIVATE_V6 = ["fc00::/7", "fe80::/10", "::1/128"]
DNS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


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


def _egress(spec: CpuLLMServiceSpec) -> list[dict[str, Any]]:
    """The servers' egress rules: DNS anywhere, HTTPS outside the private ranges, egressTo on any port."""
    public = [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": PRIVATE_V4}},
        {"ipBlock": {"cidr": "::/0", "except": PRIVATE_V6}},
    ]
    rules: list[dict[str, Any]] = [{"ports": DNS}, {"to": public, "ports": [{"protocol": "TCP", "port": 443}]}]
    if spec.network_policy.egress_to:
        rules.append({"to": _peers(spec.network_policy.egress_to)})
    return rules


def build_servers_network_policy(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    if not spec.network_policy.enabled:
        return None
    callers = [{"podSelector": {"matchLabels": router_selector(owner)}}] if uses_router(plan) else _allowed(spec)
    port = spec.service.port
    policy = _policy(
        owner.name, owner, selector(owner), [(callers, port), (_peers(spec.network_policy.metrics_from), port)]
    )
    if spec.network_policy.egress:
        policy["spec"]["policyTypes"] = ["Ingress", "Egress"]
        policy["spec"]["egress"] = _egress(spec)
    return policy


def build_router_network_policy(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    if not spec.network_policy.enabled or not uses_router(plan):
        return None
    rules = [(_allowed(spec), spec.service.port), (_peers(spec.network_policy.metrics_from), HEALTH_PORT)]
    return _policy(router_name(owner), owner, router_selector(owner), rules)


def _admit(children: list[dict[str, Any]], policy: str, peers: list[dict[str, Any]], port: int) -> None:
    """The NetworkPolicy named `policy` among `children` also admits `peers` on `port`."""
    for child in children:
        if child["kind"] == "NetworkPolicy" and child["metadata"]["name"] == policy:
            child["spec"]["ingress"].append({"from": peers, "ports": [{"protocol": "TCP", "port": port}]})


def admit_callers(
    children: list[dict[str, Any]], owner: Owner, spec: CpuLLMServiceSpec, plan: Plan, peers: list[dict[str, Any]]
) -> None:
    """The NetworkPolicy that admits the service's callers (the router's in router mode, else the servers') also
    admits `peers` on the API port: the gateways in front of it, where allowedFrom narrows who else may call."""
    if peers:
        _admit(children, router_name(owner) if uses_router(plan) else owner.name, peers, spec.service.port)


def admit_operator(children: list[dict[str, Any]], owner: Owner, port: int, peer: NetworkPolicyPeer | None) -> None:
    """The servers' NetworkPolicy among `children` also admits the operator's pods (`peer`, the admin's setting) on
    their API port, where the performance check reads /metrics (controller/performance.py); None: nothing added."""
    if peer is not None:
        _admit(children, owner.name, _peers([peer]), port)
