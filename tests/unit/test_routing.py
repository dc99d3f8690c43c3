"""spec.routing: which way requests reach the servers, the router's children and room, the InferencePool and its
HTTPRoute, the PodDisruptionBudget, and how long a server may take to drain."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.children import build_children
from cpullm.core.children.common import Owner, suffixed_name
from cpullm.core.children.router import haproxy_config
from cpullm.core.constants import DEFAULT_ROUTER_IMAGE
from cpullm.core.decision import decide
from cpullm.core.observation import Observed
from cpullm.core.planner import plan_service
from cpullm.core.routing import drain_seconds

from .builders import llama_8b, node, qwen_05b, spec
from .support import ROOT, T0, offline_and_operator

OWNER = Owner("chat", "serving", uid="u-1")
QWEN = {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "kvCacheGiB": 1, "maxModelLen": 8192}
POOL = {"mode": "inferencePool", "inferencePool": {"endpointPicker": "chat-epp"}}


def four_numa(cpu: str = "64") -> list[Any]:
    return [node("n1", numa=4, cpu=cpu)]


def plan_of(**fields: Any) -> Any:
    return plan_service(spec(**QWEN, **fields), qwen_05b(), four_numa())


def children(**fields: Any) -> dict[tuple[str, str], dict[str, Any]]:
    service_spec = spec(**QWEN, **fields)
    built = build_children(OWNER, service_spec, plan_service(service_spec, qwen_05b(), four_numa()))
    return {(c["kind"], c["metadata"]["name"]): c for c in built}


@pytest.mark.parametrize(
    ("fields", "routing"),
    [
        pytest.param({"placement": "throughput", "replicas": 2}, "router", id="throughput-several-servers"),
        pytest.param({"placement": "throughput", "replicas": 1}, "service", id="throughput-one-server"),
        pytest.param(
            {"placement": "throughput", "replicas": 1, "autoscaling": {"maxReplicas": 3}},
            "router",
            id="throughput-autoscaled-past-one",  # scaling must not switch the routing
        ),
        pytest.param({"placement": "auto", "replicas": 4}, "router", id="auto-placement-resolves-to-throughput"),
        pytest.param({"placement": "tensorParallel", "replicas": 4}, "service", id="tensor-parallel"),
        pytest.param({"placement": "throughput", "replicas": 4, "routing": {"mode": "service"}}, "service", id="asked"),
        pytest.param({"replicas": 1, "routing": {"mode": "router"}}, "router", id="router-asked-for-one-server"),
        pytest.param({"replicas": 4, "routing": POOL}, "inferencePool", id="inference-pool"),
    ],
)
def test_auto_routes_through_the_router_when_throughput_placement_may_run_several_servers(fields, routing):
    assert plan_of(**fields).routing == routing


@pytest.mark.parametrize(
    ("cpu", "router_cpu", "cpus_per_server", "requested", "note"),
    [
        pytest.param("63900m", "100m", 15, "100m", "the router", id="a-fraction-to-spare-covers-it"),
        pytest.param("64", "100m", 16, "0", "the router's memory (it requests no CPU: 100m would cost", id="none"),
        pytest.param("64", "0", 16, "0", "the router", id="asks-no-cpu"),
        pytest.param("64500m", "600m", 16, "0", "the router's memory", id="more-than-the-fraction"),
    ],
)
def test_each_node_leaves_the_router_room_without_costing_a_server_cpu(
    cpu, router_cpu, cpus_per_server, requested, note
):
    """A whole-node plan leaves one router pod's requests on each node, as a DaemonSet's, so the router never
    takes a server's CPUs; its CPU only where the nodes have it to spare: on 64 whole allocatable CPUs, 100m
    would cost one of each NUMA node's 16, so there the router requests none."""
    routing = {"mode": "router", "router": {"cpu": router_cpu}}
    service_spec = spec(**QWEN, placement="throughput", replicas=4, routing=routing)
    plan = plan_service(service_spec, qwen_05b(), four_numa(cpu))
    assert plan.cpus_per_rank == cpus_per_server
    assert f"CPU and memory left on the nodes for: {note}" in (plan.placement_note or "")
    router = next(
        c
        for c in build_children(OWNER, service_spec, plan)
        if c["metadata"]["name"] == "chat-router" and c["kind"] == "Deployment"
    )
    assert router["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == requested


def test_the_router_children_and_the_service_that_selects_them():
    built = children(placement="throughput", replicas=3, maxNumSeqs=4)
    assert sorted(built) == [
        ("ConfigMap", "chat-launcher"),
        ("ConfigMap", "chat-router"),
        ("Deployment", "chat"),
        ("Deployment", "chat-router"),
        ("NetworkPolicy", "chat"),
        ("NetworkPolicy", "chat-router"),
        ("PodDisruptionBudget", "chat"),
        ("Service", "chat"),
        ("Service", "chat-servers"),
    ]
    assert built["Service", "chat"]["spec"]["selector"] == {"cpullm.io/router": "chat"}
    servers = built["Service", "chat-servers"]["spec"]
    assert (servers["clusterIP"], servers["selector"]) == ("None", {"cpullm.io/service": "chat"})
    router = built["Deployment", "chat-router"]
    pod = router["spec"]["template"]
    assert router["spec"]["selector"] == {"matchLabels": {"cpullm.io/router": "chat"}}
    assert "cpullm.io/service" not in pod["metadata"]["labels"]  # not a server: not in the servers' selector
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "docker.io/library/haproxy:3.2"
    assert container["command"] == ["haproxy", "-W", "-db", "-f", "/etc/cpullm-router/haproxy.cfg"]
    # 64 whole CPUs: the router requests none (its 100m would cost each node one)
    assert container["resources"] == {"requests": {"cpu": "0", "memory": "128Mi"}, "limits": {"memory": "128Mi"}}
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 10}}}
    assert pod["spec"]["automountServiceAccountToken"] is False
    for owned in built.values():
        assert owned["metadata"]["ownerReferences"][0]["uid"] == "u-1"


PINNED = "registry.corp/haproxy@sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("asked", "admins", "image"),
    [
        pytest.param(None, None, DEFAULT_ROUTER_IMAGE, id="neither-the-operators-default"),
        pytest.param(None, PINNED, PINNED, id="the-admins-setting"),
        pytest.param("registry.corp/haproxy:3.3", PINNED, "registry.corp/haproxy:3.3", id="the-specs-own"),
    ],
)
def test_the_router_runs_the_specs_image_else_the_admins_setting(asked, admins, image, monkeypatch, tmp_path, capsys):
    """CPULLM_ROUTER_IMAGE (the chart's router.image) reaches the router's Deployment and status.plan.routerImage,
    offline (`cpullm render`, `cpullm plan`) and in the operator's reconcile alike; a spec's own image wins."""
    monkeypatch.delenv("CPULLM_ROUTER_IMAGE", raising=False)
    if admins:
        monkeypatch.setenv("CPULLM_ROUTER_IMAGE", admins)
    service = yaml.safe_load((ROOT / "manifests" / "examples" / "qwen-throughput.yaml").read_text())
    service["spec"]["routing"] = {"mode": "router", **({"router": {"image": asked}} if asked else {})}
    rendered, plan, kube = offline_and_operator(service, tmp_path, capsys)

    for children in (rendered, kube.applied):
        (router,) = [c for c in children if c["kind"] == "Deployment" and c["metadata"]["name"].endswith("-router")]
        assert [c["image"] for c in router["spec"]["template"]["spec"]["containers"]] == [image]
    assert plan["routerImage"] == kube.status_patches[0]["plan"]["routerImage"] == image


def test_a_new_router_configuration_rolls_the_router_and_scaling_does_not():
    first = children(placement="throughput", replicas=3)["Deployment", "chat-router"]
    again = children(placement="throughput", replicas=2)["Deployment", "chat-router"]
    changed = children(placement="throughput", replicas=3, maxNumSeqs=2)["Deployment", "chat-router"]
    digest = "cpullm.io/router-config"

    def annotation(d: dict[str, Any]) -> str:
        return d["spec"]["template"]["metadata"]["annotations"][digest]

    assert annotation(first) == annotation(again) != annotation(changed)


@pytest.mark.parametrize(
    ("fields", "lines"),
    [
        pytest.param(
            {"placement": "throughput", "replicas": 3},
            [
                "  balance leastconn",
                "  server-template server 1-4 chat-servers.serving.svc.cluster.local:8000",
                "  default-server check inter 2s fall 2 rise 1 resolvers cluster init-addr none",
                "  timeout server 2024s",  # 8192 tokens x 0.988 GB of bf16 weights / 4 GB/s
                "  hard-stop-after 2024s",
                "  monitor fail if { nbsrv(servers) eq 0 }",
            ],
            id="defaults",
        ),
        pytest.param(
            {
                "placement": "throughput",
                "replicas": 1,
                "maxNumSeqs": 8,
                "service": {"port": 9000},
                "autoscaling": {"maxReplicas": 6},
                "routing": {"drainSeconds": 120, "router": {"clusterDomain": "corp.internal"}},
            },
            [
                # a slot per server the chosen nodes hold (4 NUMA nodes), whatever the replicas
                "  server-template server 1-4 chat-servers.serving.svc.corp.internal:9000",
                "  default-server check inter 2s fall 2 rise 1 resolvers cluster init-addr none maxconn 8",
                "  timeout server 120s",
                "  bind :9000",
            ],
            id="autoscaled-bounded-and-drain-set",
        ),
        pytest.param(
            {"placement": "throughput", "maxNumSeqs": 8, "routing": {"router": {"affinity": "prefix"}}},
            [
                # prefix affinity: the conversation's key, its last server remembered, new ones least busy
                "  balance leastconn",
                "  option http-buffer-request",
                "  http-request set-var(txn.affinity) req.body,json_query('$.messages[0].content') "
                "unless { var(txn.affinity) -m found }",
                "  http-request set-var(txn.affinity) req.body,json_query('$.prompt'),bytes(0,256) "
                "unless { var(txn.affinity) -m found }",
                "  stick-table type binary len 20 size 65536 expire 30m",
                "  stick on var(txn.affinity),sha1",
                # loadFactor 150 of 8 running: 4 more may wait for a conversation's server
                "  default-server check inter 2s fall 2 rise 1 resolvers cluster init-addr none maxconn 8 maxqueue 4",
            ],
            id="prefix-affinity",
        ),
        pytest.param(
            {
                "placement": "throughput",
                "maxNumSeqs": 2,
                "routing": {"router": {"affinity": "prefix", "sessionHeader": "X-Session-Id", "loadFactor": 125}},
            },
            [
                "  http-request set-var(txn.affinity) req.hdr(x-session-id) if { req.hdr(x-session-id) -m found }",
                # a quarter of 2 is half a request: at least one waits, else maxqueue 0 would mean no bound
                "  default-server check inter 2s fall 2 rise 1 resolvers cluster init-addr none maxconn 2 maxqueue 1",
            ],
            id="a-session-header-first-and-the-bound-rounded-up",
        ),
        pytest.param(
            {"placement": "throughput", "routing": {"router": {"affinity": "prefix", "loadFactor": 300}}},
            [
                # no maxNumSeqs rendered (an explicit kvCacheGiB): no limit in the router, so no bound
                "  stick on var(txn.affinity),sha1",
                "  default-server check inter 2s fall 2 rise 1 resolvers cluster init-addr none",
            ],
            id="prefix-without-max-num-seqs",
        ),
    ],
)
def test_the_haproxy_configuration(fields, lines):
    service_spec = spec(**QWEN, **fields)
    config = haproxy_config(OWNER, service_spec, plan_service(service_spec, qwen_05b(), four_numa()))
    assert set(lines) <= set(config.splitlines())


@pytest.mark.parametrize(
    ("gateway", "kinds"),
    [(None, ["InferencePool"]), ("inference-gateway", ["InferencePool", "HTTPRoute"])],
)
def test_an_inference_pool_selects_the_servers_and_an_httproute_attaches_it_to_the_gateway(gateway, kinds):
    pool_settings = {"endpointPicker": "chat-epp", **({"gateway": gateway} if gateway else {})}
    built = children(replicas=2, routing={"mode": "inferencePool", "inferencePool": pool_settings})
    assert [kind for kind, _ in built if kind in ("InferencePool", "HTTPRoute")] == kinds
    assert built["Service", "chat"]["spec"]["selector"] == {"cpullm.io/service": "chat"}  # still an address
    pool = built["InferencePool", "chat"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"] == {
        "selector": {"matchLabels": {"cpullm.io/service": "chat"}},
        "targetPorts": [{"number": 8000}],
        "endpointPickerRef": {"name": "chat-epp", "port": {"number": 9002}},
    }
    if gateway:
        route = built["HTTPRoute", "chat"]
        assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
        assert route["spec"]["parentRefs"] == [{"name": gateway}]
        (rule,) = route["spec"]["rules"]
        assert rule["backendRefs"] == [
            {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat"}
        ]


@pytest.mark.parametrize(
    ("crds", "routing"),
    [
        pytest.param(
            frozenset({"inferencepools.inference.networking.k8s.io", "httproutes.gateway.networking.k8s.io"}),
            ("True", "InferencePoolApplied", "InferencePool chat; HTTPRoute chat"),
            id="both-served",
        ),
        pytest.param(
            frozenset({"inferencepools.inference.networking.k8s.io"}),
            (
                "False",
                "HTTPRouteCRDMissing",
                "the HTTPRoute API (gateway.networking.k8s.io/v1) is not installed: install the Gateway API (CRD "
                "httproutes.gateway.networking.k8s.io); the HTTPRoute is applied as soon as it is",
            ),
            id="gateway-api-missing",
        ),
    ],
)
def test_one_routing_condition_for_the_pool_and_its_route(crds, routing):
    """Two kinds report under one condition type (the API server keeps one per type): False wins."""
    fields = {"routing": {"mode": "inferencePool", "inferencePool": {"endpointPicker": "e", "gateway": "g"}}}
    observed = Observed(
        owner=OWNER,
        generation=1,
        spec=spec(**QWEN, **fields),
        requested_replicas=1,
        model=qwen_05b(),
        nodes=four_numa(),
        installed_crds=crds,
    )
    decision = decide(observed, T0)
    found = {c["type"]: (c["status"], c["reason"], c["message"]) for c in decision.status["conditions"]}
    assert found["Routing"] == routing


@pytest.mark.parametrize(
    ("fields", "budget"),
    [
        pytest.param({"replicas": 1}, False, id="one-server"),
        pytest.param({"replicas": 2}, True, id="two-servers"),
        pytest.param({"replicas": 1, "autoscaling": {"maxReplicas": 2}}, True, id="autoscaled-past-one"),
    ],
)
def test_a_disruption_budget_when_the_service_may_run_several_servers(fields, budget):
    built = children(**fields)
    assert (("PodDisruptionBudget", "chat") in built) is budget
    if budget:
        assert built["PodDisruptionBudget", "chat"]["spec"] == {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {"cpullm.io/service": "chat"}},
        }


@pytest.mark.parametrize(
    ("asked", "max_model_len", "shard_bytes", "seconds"),
    [
        pytest.param(None, 4096, 10**9, 1024, id="context-x-shard-over-4GB/s"),
        pytest.param(None, 100, 10**9, 30, id="at-least-30s"),
        pytest.param(None, 131072, 10**10, 3600, id="at-most-an-hour"),
        pytest.param(None, None, 10**9, 3600, id="no-context-length-the-most"),
        pytest.param(45, 131072, 10**10, 45, id="the-spec-says"),
        pytest.param(0, 4096, 10**9, 0, id="no-drain-asked"),
    ],
)
def test_drain_seconds(asked, max_model_len, shard_bytes, seconds):
    service_spec = spec(routing={"drainSeconds": asked} if asked is not None else {})
    assert drain_seconds(service_spec, max_model_len, shard_bytes) == seconds


def test_the_servers_drain_within_their_grace_period():
    service_spec = spec(**{**QWEN, "maxModelLen": 4096}, replicas=2, placement="throughput")
    plan = plan_service(service_spec, qwen_05b(), four_numa())
    deployment = next(c for c in build_children(OWNER, service_spec, plan) if c["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert (deployment["metadata"]["name"], plan.drain_seconds) == ("chat", 1012)  # 4096 x 0.988 GB / 4 GB/s
    assert pod["terminationGracePeriodSeconds"] == 10 + 1012 + 30
    (container,) = pod["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "-c"] and command[3:] == ["8000", "10"]


@pytest.mark.parametrize(("name", "expected"), [("chat", "chat-servers"), ("a" * 55, "a" * 55 + "-servers")])
def test_a_childs_name_is_the_services_with_a_suffix(name, expected):
    assert suffixed_name(Owner(name, "ns"), "servers", 63) == expected


def test_a_name_too_long_for_a_dns_label_is_cut_short_with_a_hash():
    """63-character service names: two that differ only at the end still get different children."""
    first, second = ("a" * 62 + last for last in "bc")
    made = {suffixed_name(Owner(name, "ns"), "servers", 63) for name in (first, second)}
    assert len(made) == 2
    for name in made:
        assert len(name) == 63 and name.startswith("a" * 46 + "-") and name.endswith("-servers")


@pytest.mark.parametrize(
    ("routing", "message"),
    [
        ({"mode": "inferencePool"}, "mode inferencePool needs inferencePool.endpointPicker"),
        ({"mode": "hash"}, "Input should be 'auto', 'service', 'router' or 'inferencePool'"),
        ({"router": {"cpu": "-1"}}, "String should match pattern"),
        ({"router": {"memory": "1Ei"}}, "String should match pattern"),
        ({"router": {"replicas": 0}}, "greater than or equal to 1"),
        ({"drainSeconds": -1}, "greater than or equal to 0"),
        ({"router": {"clusterDomain": "Bad_Domain"}}, "String should match pattern"),
        ({"router": {"image": "r/" * 513}}, "at most 1024 characters"),
    ],
)
def test_bad_routing_is_refused(routing, message):
    with pytest.raises(ValidationError, match=message):
        CpuLLMServiceSpec.model_validate({"model": {"name": "m"}, "kvCacheGiB": 1, "routing": routing})


def test_a_tensor_parallel_service_keeps_its_whole_cpus():
    """No router, no room: an 8B model over two NUMA nodes plans as before."""
    plan = plan_service(spec(replicas=3), llama_8b(), [node("n1", numa=2)])
    assert (plan.routing, plan.cpu, plan.router_image) == ("service", 64, None)


@pytest.mark.parametrize("header", ["x session", "x-id) if TRUE", "-leading", "x" * 65, "a\nb"])
def test_a_session_header_that_is_no_header_name_is_refused(header):
    """The header's name is written into HAProxy's configuration: only a token of letters, digits and dashes."""
    with pytest.raises(ValidationError):
        CpuLLMServiceSpec.model_validate({"model": {"name": "m"}, "routing": {"router": {"sessionHeader": header}}})
