"""spec.networkPolicy: who may reach a service's servers and router (the API server admits the objects in
e2e/test_tenancy.py)."""

from __future__ import annotations

from typing import Any

import pytest

from cpullm.api.spec import parse_spec
from cpullm.core.children import build_children
from cpullm.core.children.common import Owner
from cpullm.core.decision import decide
from cpullm.core.planner import plan_service
from cpullm.errors import InvalidSpec

from .builders import node, qwen_05b, spec
from .support import T0, observed

OWNER = Owner(name="chat", namespace="team-a", uid="u-1")
QWEN = {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "kvCacheGiB": 1, "maxModelLen": 4096}
ROUTED = {"placement": "throughput", "replicas": 3, "maxNumSeqs": 4}
NAMESPACE = [{"podSelector": {}}]
GATEWAY = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def policies(**fields: Any) -> dict[str, dict[str, Any]]:
    service_spec = spec(**{**QWEN, **fields})
    children = build_children(
        OWNER, service_spec, plan_service(service_spec, qwen_05b(), [node("n1", numa=4, cpu="64")])
    )
    return {c["metadata"]["name"]: c["spec"] for c in children if c["kind"] == "NetworkPolicy"}


def ingress(peers: list[dict[str, Any]], port: int) -> dict[str, Any]:
    return {"from": peers, "ports": [{"protocol": "TCP", "port": port}]}


SERVERS = {"matchLabels": {"cpullm.io/service": "chat"}}
ROUTER = {"matchLabels": {"cpullm.io/router": "chat"}}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({}, {"chat": (SERVERS, [ingress(NAMESPACE, 8000)])}, id="service-mode-the-namespace"),
        pytest.param(
            {"networkPolicy": {"allowedFrom": [GATEWAY], "metricsFrom": [PROMETHEUS]}},
            {"chat": (SERVERS, [ingress([GATEWAY], 8000), ingress([PROMETHEUS], 8000)])},
            id="service-mode-named-callers-and-prometheus",
        ),
        pytest.param(
            {"networkPolicy": {"allowedFrom": []}, "service": {"port": 9000}},
            {"chat": (SERVERS, [])},
            id="nobody-but-the-node",
        ),
        pytest.param(
            ROUTED,
            {
                "chat": (SERVERS, [ingress([{"podSelector": ROUTER}], 8000)]),
                "chat-router": (ROUTER, [ingress(NAMESPACE, 8000)]),
            },
            id="router-mode-servers-admit-only-their-router",
        ),
        pytest.param(
            {**ROUTED, "networkPolicy": {"metricsFrom": [PROMETHEUS]}},
            {
                "chat": (SERVERS, [ingress([{"podSelector": ROUTER}], 8000), ingress([PROMETHEUS], 8000)]),
                "chat-router": (ROUTER, [ingress(NAMESPACE, 8000), ingress([PROMETHEUS], 8404)]),
            },
            id="router-mode-prometheus-on-the-routers-metrics-port",
        ),
        pytest.param({"networkPolicy": {"enabled": False}}, {}, id="opted-out"),
        pytest.param({**ROUTED, "networkPolicy": {"enabled": False}}, {}, id="opted-out-router-mode"),
    ],
)
def test_who_may_reach_the_servers_and_the_router(fields, expected):
    found = policies(**fields)
    assert {name: (p["podSelector"], p["ingress"]) for name, p in found.items()} == expected
    assert all(p["policyTypes"] == ["Ingress"] for name, p in found.items() if name != "chat")  # the router's egress
    # reaches its servers


# What a server may reach by default: DNS anywhere, HTTPS outside the private ranges.
DNS_RULE = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"]
PUBLIC_HTTPS = {
    "to": [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": PRIVATE}},
        {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10", "::1/128"]}},
    ],
    "ports": [{"protocol": "TCP", "port": 443}],
}
MIRROR = {"ipBlock": {"cidr": "10.20.0.5/32"}}


@pytest.mark.parametrize(
    ("fields", "egress"),
    [
        pytest.param({}, [DNS_RULE, PUBLIC_HTTPS], id="dns-and-public-https"),
        pytest.param(ROUTED, [DNS_RULE, PUBLIC_HTTPS], id="router-mode-the-same"),
        pytest.param(
            {"networkPolicy": {"egressTo": [MIRROR]}}, [DNS_RULE, PUBLIC_HTTPS, {"to": [MIRROR]}], id="a-mirror-named"
        ),
        pytest.param({"networkPolicy": {"egress": False}}, None, id="egress-opted-out"),
    ],
)
def test_what_the_servers_may_reach(fields, egress):
    servers = policies(**fields)["chat"]
    if egress is None:
        assert servers["policyTypes"] == ["Ingress"] and "egress" not in servers
        return
    assert servers["policyTypes"] == ["Ingress", "Egress"]
    assert servers["egress"] == egress
    # No rule lets a server reach the cluster's private ranges on another port, nor the metadata address on 443.
    assert all("to" in rule or rule == DNS_RULE for rule in servers["egress"])


def test_a_peer_must_name_something():
    with pytest.raises(InvalidSpec, match="a peer needs podSelector, namespaceSelector or ipBlock"):
        parse_spec({**QWEN, "networkPolicy": {"allowedFrom": [{}]}})


def test_an_ip_block_keeps_its_except():
    block = {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}
    assert policies(networkPolicy={"allowedFrom": [block]})["chat"]["ingress"] == [ingress([block], 8000)]


FRONT = {"podSelector": {"matchExpressions": [{"key": "cpullm.io/gateway", "operator": "In", "values": ["a", "b"]}]}}


@pytest.mark.parametrize(
    ("fields", "gateways", "expected"),
    [
        # The namespace's pods are admitted already: a gateway in it needs no rule of its own.
        pytest.param({}, ("b", "a"), {"chat": [ingress(NAMESPACE, 8000)]}, id="default-the-namespace-holds-them"),
        pytest.param(
            {"networkPolicy": {"allowedFrom": [GATEWAY]}},
            ("b", "a"),
            {"chat": [ingress([GATEWAY], 8000), ingress([FRONT], 8000)]},
            id="narrowed-the-gateways-admitted",
        ),
        pytest.param(
            {"networkPolicy": {"allowedFrom": []}},
            (),
            {"chat": []},
            id="narrowed-no-gateway-nothing-added",
        ),
        pytest.param(
            {**ROUTED, "networkPolicy": {"allowedFrom": [], "metricsFrom": [PROMETHEUS]}},
            ("a", "b"),
            {
                "chat": [ingress([{"podSelector": ROUTER}], 8000), ingress([PROMETHEUS], 8000)],
                "chat-router": [ingress([PROMETHEUS], 8404), ingress([FRONT], 8000)],
            },
            id="router-mode-the-router-admits-them",
        ),
    ],
)
def test_the_gateways_in_front_of_a_service_are_admitted_where_allowed_from_narrows_its_callers(
    fields, gateways, expected
):
    decision = decide(observed(owner=OWNER, spec=spec(**{**QWEN, **fields}), model=qwen_05b(), gateways=gateways), T0)
    found = {c["metadata"]["name"]: c["spec"]["ingress"] for c in decision.children if c["kind"] == "NetworkPolicy"}
    assert found == expected
