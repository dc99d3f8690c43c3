"""CpuLLMGateway: its spec, what it routes, the children it renders for each option, its status and events, and
its reconciler's writes (a fake API). What HAProxy does with the configuration is e2e/test_gateway_proxy.py's."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from cpullm.api.crd import build_gateway_crd
from cpullm.api.gateway import CpuLLMGatewaySpec, parse_gateway_spec
from cpullm.controller.gateway import GatewayReconciler, controlling_gateway, namespace_services
from cpullm.core.gateway import (
    GATEWAY_SCRIPT,
    GatewayOwner,
    ceilings,
    config_files,
    decide_gateway,
    fronts,
    gateway_name,
    memory_bytes,
    routes,
    shares,
)
from cpullm.core.gateway_usage import GENERATED_ACTION, GENERATED_RETRY, USAGE_LUA
from cpullm.core.observation import Ownership
from cpullm.errors import ChildExists, InvalidSpec

from .support import ROOT

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
OWNER = GatewayOwner("front", "teams", uid="g-1", generation=3)
IMAGE = "docker.io/library/haproxy:3.2"


def gateway_spec(**fields: Any) -> CpuLLMGatewaySpec:
    raw: dict[str, Any] = {
        "services": ["chat", "code"],
        "teams": [{"name": "team-a", "keySecret": {"name": "a-key"}}],
        **fields,
    }
    return parse_gateway_spec(raw)


def service(
    name: str,
    model: str,
    adapters: tuple[str, ...] = (),
    port: int = 8000,
    key: str | None = None,
    seqs: int | None = None,
    replicas: int = 1,
    saturation: int | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": model, "config": {}},
        "replicas": replicas,
        "adapters": [{"name": a, "source": "org/adapter", "rank": 8} for a in adapters],
        "service": {"port": port},
    }
    if key:
        spec["apiKeySecret"] = {"name": key, "key": "token"}
    status = {"plan": {"maxNumSeqs": seqs, "drainSeconds": 120}} if seqs else {}
    if saturation is not None:
        status["plan"]["predicted"] = {"saturationStreams": saturation}
    return {"metadata": {"name": name, "namespace": "teams"}, "spec": spec, "status": status}


SERVICES = {"chat": service("chat", "org/chat", ("chat-lora",)), "code": service("code", "org/code")}


def cfg_lines(spec: CpuLLMGatewaySpec, services: Mapping[str, Any] = SERVICES) -> list[str]:
    return config_files(OWNER, spec, routes(spec, services))["haproxy.cfg"].splitlines()


def by_kind(decision: Any) -> dict[str, dict[str, Any]]:
    return {c["kind"]: c for c in decision.children}


# -- the spec -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"services": [], "teams": [{"name": "a", "keySecret": {"name": "k"}}]}, "spec.services: List should have"),
        ({"services": ["s"], "teams": []}, "spec.teams: List should have"),
        ({"services": ["s", "s"], "teams": [{"name": "a", "keySecret": {"name": "k"}}]}, "each service is listed once"),
        (
            {
                "services": ["s"],
                "teams": [{"name": "a", "keySecret": {"name": "k"}}, {"name": "a", "keySecret": {"name": "j"}}],
            },
            "each team needs a name of its own",
        ),
        ({"services": ["s"], "teams": [{"name": "Team A", "keySecret": {"name": "k"}}]}, "spec.teams.0.name"),
        ({"services": ["s"], "teams": [{"name": "a", "keySecret": {"name": "k"}, "models": ["a b"]}]}, "models.0"),
        ({"services": ["s"], "teams": [{"name": "a", "keySecret": {"name": "k"}, "priority": 5000}]}, "priority"),
        (
            {"services": ["s"], "teams": [{"name": "a", "keySecret": {"name": "k"}}], "replica": 2},
            "did you mean replicas",
        ),
        ({"services": ["s"], "teams": [{"name": "a", "keySecret": "k"}]}, "should be an object with name, key"),
    ],
)
def test_a_bad_gateway_spec_is_refused_naming_the_field(raw: dict[str, Any], problem: str):
    with pytest.raises(InvalidSpec) as refused:
        parse_gateway_spec(raw)
    assert problem in refused.value.message


def test_the_gateway_crd_is_generated_and_the_chart_ships_it():
    """`cpullm crd --kind CpuLLMGateway > crds/cpullm.io_cpullmgateways.yaml`; the chart's crds/ is a copy."""
    generated = yaml.safe_dump(build_gateway_crd(), sort_keys=False)
    name = "cpullm.io_cpullmgateways.yaml"
    assert (ROOT / "crds" / name).read_text() == generated
    assert (ROOT / "charts" / "cpullm-operator" / "crds" / name).read_text() == generated
    schema = build_gateway_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    teams = schema["properties"]["teams"]
    assert (teams["x-kubernetes-list-type"], teams["x-kubernetes-list-map-keys"]) == ("map", ["name"])
    assert schema["properties"]["services"]["x-kubernetes-list-type"] == "set"


# -- what it routes -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("services", "routed", "problems"),
    [
        (SERVICES, {"org/chat": "chat", "chat-lora": "chat", "org/code": "code"}, []),
        ({"chat": SERVICES["chat"]}, {"org/chat": "chat", "chat-lora": "chat"}, ["service code not found"]),
        (
            {"chat": SERVICES["chat"], "code": service("code", "org/chat")},
            {"org/chat": "chat", "chat-lora": "chat"},
            ["org/chat is served by chat and code: it goes to the first"],
        ),
        (
            {"chat": SERVICES["chat"], "code": service("code", "/models/my model")},
            {"org/chat": "chat", "chat-lora": "chat"},
            ["service code: model name '/models/my model' cannot be routed"],
        ),
        (
            {"chat": SERVICES["chat"], "code": {"metadata": {"name": "code"}, "spec": {"replicas": "x"}}},
            {"org/chat": "chat", "chat-lora": "chat"},
            ["service code: its spec is invalid (InvalidSpec)"],
        ),
    ],
)
def test_each_model_name_goes_to_the_first_service_listed_that_serves_it(
    services: Mapping[str, Any], routed: dict[str, str], problems: list[str]
):
    found = routes(gateway_spec(), services)
    assert dict(found.model_service) == routed
    assert len(found.problems) == len(problems)
    for problem, expected in zip(found.problems, problems, strict=True):
        assert problem.startswith(expected), problem


def test_a_teams_models_are_its_list_or_every_routed_one():
    spec = gateway_spec(
        teams=[
            {"name": "team-a", "keySecret": {"name": "a"}, "models": ["chat-lora", "gone"]},
            {"name": "team-b", "keySecret": {"name": "b"}},
        ]
    )
    files = config_files(OWNER, spec, routes(spec, SERVICES))
    assert files["grants.map"] == "team-a/chat-lora 1\nteam-b/chat-lora 1\nteam-b/org/chat 1\nteam-b/org/code 1\n"
    assert files["models.map"] == "chat-lora svc-chat\norg/chat svc-chat\norg/code svc-code\n"
    assert (
        files["models-team-a.json"]
        == '{"object":"list","data":[{"id":"chat-lora","object":"model","owned_by":"cpullm"}]}'
    )
    assert [m for m in yaml.safe_load(files["models-team-b.json"])["data"]] == [
        {"id": m, "object": "model", "owned_by": "cpullm"} for m in ("chat-lora", "org/chat", "org/code")
    ]
    assert files["start.sh"] == GATEWAY_SCRIPT


# -- HAProxy's configuration, option by option --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "services", "present", "absent"),
    [
        ({}, SERVICES, ["  bind :8000", "  tune.bufsize 294912", "  maxconn 256"], ["set-priority-class", "429"]),
        (
            {"port": 9000, "maxRequestBytes": 1048576, "maxConnections": 64},
            SERVICES,
            ["  bind :9000", "  tune.bufsize 1081344", "  maxconn 64", "{ req.body_size gt 1048576 }"],
            [],
        ),
        # A rate shared out among the replicas (default 2), with the time one request's share takes to come back.
        (
            {"teams": [{"name": "team-a", "keySecret": {"name": "a"}, "requestsPerMinute": 100}]},
            SERVICES,
            ["hdr Retry-After 2 content-type", "{ var(txn.team) -m str team-a } { sc_http_req_rate(0) gt 50 }"],
            [],
        ),
        (
            {"replicas": 1, "teams": [{"name": "team-a", "keySecret": {"name": "a"}, "requestsPerMinute": 600}]},
            SERVICES,
            ["hdr Retry-After 1 content-type", "{ sc_http_req_rate(0) gt 600 }"],
            [],
        ),
        # Generated tokens a minute, shared out the same way; no rule for a team without a limit, one refusal for all.
        (
            {
                "teams": [
                    {"name": "team-a", "keySecret": {"name": "a"}, "generatedTokensPerMinute": 1001},
                    {"name": "team-b", "keySecret": {"name": "b"}},
                ]
            },
            SERVICES,
            [
                "  http-request lua.generated_window 501 if { var(txn.team) -m str team-a }",
                "hdr Retry-After %[var(txn.generated_retry)] content-type",
                "if { var(txn.generated_retry) -m found }",
            ],
            ["lua.generated_window 501 if { var(txn.team) -m str team-b }"],
        ),
        (
            {"teams": [{"name": "team-a", "keySecret": {"name": "a"}}]},
            SERVICES,
            [],
            ["lua.generated_window", "txn.generated_retry"],
        ),
        (
            {"teams": [{"name": "team-a", "keySecret": {"name": "a"}, "priority": 7}]},
            SERVICES,
            ["  http-request set-priority-class int(-7) if { var(txn.team) -m str team-a }"],
            [],
        ),
        # The servers' own guard: their key in place of the team's; without one, the team's key goes no further.
        (
            {},
            {**SERVICES, "code": service("code", "org/code", key="code-key", port=8080)},
            [
                '  http-request set-header authorization "Bearer ${CPULLM_SERVICE_KEY_1}"',
                "  server code code.teams.svc.cluster.local:8080 resolvers cluster init-addr last,libc,none",
            ],
            [],
        ),
        # What the servers run at once (maxNumSeqs x replicas): more wait in the gateway, by priority.
        (
            {},
            {**SERVICES, "chat": service("chat", "org/chat", seqs=8, replicas=3)},
            [
                "  server chat chat.teams.svc.cluster.local:8000 resolvers cluster init-addr last,libc,none maxconn 24",
                "  hard-stop-after 3600s",
            ],
            [],
        ),
        ({"clusterDomain": "k8s.internal"}, SERVICES, ["code.teams.svc.k8s.internal:8000"], ["cluster.local"]),
    ],
)
def test_haproxys_configuration_follows_each_option(
    fields: dict[str, Any], services: Mapping[str, Any], present: list[str], absent: list[str]
):
    text = "\n".join(cfg_lines(gateway_spec(**fields), services))
    for line in present:
        assert line in text
    for line in absent:
        assert line not in text
    assert text.count("del-header authorization") + text.count("set-header authorization") == len(services)


def test_usage_is_counted_for_routed_requests_and_served_on_the_metrics_port():
    lines = cfg_lines(gateway_spec())
    files = config_files(OWNER, gateway_spec(), routes(gateway_spec(), SERVICES))
    assert files["usage.lua"] == USAGE_LUA
    # The names the configuration calls are the ones the Lua registers and sets.
    assert f'core.register_action("{GENERATED_ACTION}", {{"http-req"}}' in USAGE_LUA
    assert f'txn:set_var("{GENERATED_RETRY}"' in USAGE_LUA
    assert "  lua-load /etc/cpullm-gateway/usage.lua" in lines and "  nbthread 1" in lines
    assert lines.index("  filter lua.usage") > lines.index("frontend api")
    health = lines[lines.index("frontend health") : lines.index("frontend api")]
    assert "  http-request use-service lua.usage if { path /usage }" in health
    # Only what passed every check is counted: the flag is set just before the backend is chosen.
    assert (
        lines.index("  http-request set-var(txn.routed) bool(true)")
        == lines.index("  use_backend %[var(txn.backend)]") - 1
    )
    # The listening sockets pass to the new worker on a reload.
    assert "  stats socket /run/cpullm-gateway/haproxy.sock mode 600 level user expose-fd listeners" in lines


@pytest.mark.parametrize(
    ("teams", "expected"),
    [
        # Two teams may use both services: half of each service's capacity each.
        (
            [{"name": "a", "keySecret": {"name": "a"}}, {"name": "b", "keySecret": {"name": "b"}}],
            {("a", "chat"): 4, ("b", "chat"): 4, ("a", "code"): 2, ("b", "code"): 2},
        ),
        # By weight; a team that may not use a service has no share of it, nor counts against the others.
        (
            [
                {"name": "a", "keySecret": {"name": "a"}, "weight": 3},
                {"name": "b", "keySecret": {"name": "b"}},
                {"name": "c", "keySecret": {"name": "c"}, "models": ["org/code"]},
            ],
            {("a", "chat"): 6, ("b", "chat"): 2, ("a", "code"): 3, ("b", "code"): 1, ("c", "code"): 1},
        ),
    ],
)
def test_each_team_has_a_share_of_each_service_it_uses_by_weight(teams: list[Any], expected: dict[Any, int]):
    services = {"chat": service("chat", "org/chat", seqs=8), "code": service("code", "org/code", seqs=4)}
    spec = gateway_spec(teams=teams)
    assert shares(spec, routes(spec, services)) == expected
    lines = cfg_lines(spec, services)
    over = [line for line in lines if "set-priority-class int(2047)" in line]
    assert len(over) == len(expected)
    assert "{ var(txn.team) -m str a } { var(txn.backend) -m str svc-chat } { sc_conn_cur(0) gt" in over[0]
    assert lines.index(over[0]) > max(i for i, line in enumerate(lines) if "return status 403" in line)
    # Without a capacity (no plan yet), nothing waits in the gateway and there are no shares.
    assert shares(spec, routes(spec, SERVICES)) == {}


A, B, C = ({"name": n, "keySecret": {"name": n}} for n in ("a", "b", "c"))


@pytest.mark.parametrize(
    ("teams", "chat", "expected"),
    [
        # One team: nobody to leave a slot for.
        ([A], service("chat", "org/chat", seqs=8), {}),
        # Two: each may fill all but one slot, so the other's next request finds one free.
        ([A, B], service("chat", "org/chat", seqs=8), {("a", "chat"): 7, ("b", "chat"): 7}),
        # The plan's saturation, not maxNumSeqs, is what the servers run at once; replicas multiply it.
        ([A, B], service("chat", "org/chat", seqs=256, saturation=3, replicas=2), {("a", "chat"): 5, ("b", "chat"): 5}),
        # A team that may not use the service leaves no slot on it.
        (
            [A, B, {**C, "models": ["org/code"]}],
            service("chat", "org/chat", seqs=4),
            {("a", "chat"): 3, ("b", "chat"): 3},
        ),
        # More teams than slots: each keeps to its share (by weight) instead.
        ([{**A, "weight": 3}, B, C], service("chat", "org/chat", seqs=2), {("b", "chat"): 1, ("c", "chat"): 1}),
        # A service that runs one at a time has nothing to reserve.
        ([A, B], service("chat", "org/chat", seqs=1), {}),
        # No plan yet: no capacity, nothing waits.
        ([A, B], service("chat", "org/chat"), {}),
    ],
)
def test_a_team_leaves_a_slot_of_a_full_service_for_each_other_team(
    teams: list[Any], chat: dict[str, Any], expected: dict[Any, int]
):
    spec = gateway_spec(teams=teams)
    services = {"chat": chat, "code": service("code", "org/code")}
    assert ceilings(spec, routes(spec, services)) == expected
    lines = cfg_lines(spec, services)
    routed = [line for line in lines if line.startswith("  use_backend slot:")]
    assert len(routed) == len(expected)
    if not expected:
        assert not any(line.startswith("frontend inner-") for line in lines)
        return
    # A team's requests beyond its ceiling wait in its slot, which passes the others on with their priority class,
    # through a loopback frontend, into the service's backend; a client cannot set that class itself, and the
    # servers never see the header.
    inner = lines.index("frontend inner-chat")
    port = lines[inner + 1].removeprefix("  bind 127.0.0.1:")
    assert int(port) not in (8000, 8404) and lines[inner + 3] == "  default_backend svc-chat"
    for (team, svc), ceiling in expected.items():
        assert (
            lines[lines.index(f"backend slot:{team}:{svc}") + 1] == f"  server {svc} 127.0.0.1:{port} maxconn {ceiling}"
        )
        when = f"{{ var(txn.team) -m str {team} }} {{ var(txn.backend) -m str svc-{svc} }}"
        assert f"  use_backend slot:{team}:{svc} if {when}" in routed
    assert lines[lines.index("frontend api") + 3] == "  http-request del-header x-cpullm-priority-class"
    assert "  http-request del-header x-cpullm-priority-class" in lines[lines.index("backend svc-chat") :]
    last_class = max(i for i, line in enumerate(lines) if "set-priority-class int(" in line)
    assert last_class < lines.index("  http-request set-header x-cpullm-priority-class %[prio_class]")


def test_the_refusals_come_in_order_each_in_openais_error_shape():
    team = {"name": "team-a", "keySecret": {"name": "a"}, "requestsPerMinute": 10, "generatedTokensPerMinute": 99}
    lines = cfg_lines(gateway_spec(teams=[team]))
    api = lines[lines.index("frontend api") :]
    codes = [int(line.split("status ")[1].split()[0]) for line in api if "http-request return status" in line]
    assert codes == [401, 200, 429, 429, 413, 400, 404, 403]  # 200: the team's GET /v1/models
    refusals = [line for line in lines if "http-request return status 4" in line]
    for line in refusals:
        body = line.split("string '")[1].split("'")[0]
        assert set(yaml.safe_load(body)["error"]) == {"message", "type", "code"}


def test_a_drain_follows_the_longest_fronted_plan():
    slow = {**SERVICES, "chat": service("chat", "org/chat", seqs=4)}
    slow["chat"]["status"]["plan"]["drainSeconds"] = 900
    assert "  hard-stop-after 900s" in cfg_lines(gateway_spec(), {"chat": slow["chat"]})


# -- the children -------------------------------------------------------------------------------------------------


def test_the_children_of_a_gateway():
    decision = decide_gateway(OWNER, gateway_spec(), SERVICES, None, {}, IMAGE, T0)
    children = by_kind(decision)
    assert sorted(children) == ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service"]
    for child in decision.children:
        meta = child["metadata"]
        assert (meta["name"], meta["namespace"]) == ("front-gateway", "teams")
        assert meta["labels"]["cpullm.io/gateway"] == "front" and "cpullm.io/service" not in meta["labels"]
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "cpullm.io/v1alpha1",
                "kind": "CpuLLMGateway",
                "name": "front",
                "uid": "g-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    pod = children["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == IMAGE and container["command"] == ["/bin/sh", "/etc/cpullm-gateway/start.sh"]
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "208Mi"}, "limits": {"memory": "208Mi"}}
    assert container["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert pod["automountServiceAccountToken"] is False
    keys = next(v for v in pod["volumes"] if v["name"] == "keys")["projected"]["sources"]
    assert keys == [{"secret": {"name": "a-key", "optional": True, "items": [{"key": "api-key", "path": "team-a"}]}}]
    assert "env" not in container  # no service has a key of its own
    assert children["Service"]["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    assert children["NetworkPolicy"]["spec"]["ingress"] == [
        {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": 8000}]}
    ]
    assert children["PodDisruptionBudget"]["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"cpullm.io/gateway": "front"}},
    }


def test_options_reach_the_children():
    spec = gateway_spec(
        replicas=1,
        image="registry.local/haproxy:2.8",
        allowedFrom=[{"namespaceSelector": {"matchLabels": {"team": "ml"}}}],
        metricsFrom=[{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
    )
    services = {**SERVICES, "code": service("code", "org/code", key="code-key")}
    children = by_kind(decide_gateway(OWNER, spec, services, None, {}, IMAGE, T0))
    assert "PodDisruptionBudget" not in children
    container = children["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.local/haproxy:2.8"
    assert container["env"] == [
        {"name": "CPULLM_SERVICE_KEY_1", "valueFrom": {"secretKeyRef": {"name": "code-key", "key": "token"}}}
    ]
    assert children["NetworkPolicy"]["spec"]["ingress"] == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}],
            "ports": [{"protocol": "TCP", "port": 8000}],
        },
        {
            "from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            "ports": [{"protocol": "TCP", "port": 8404}],
        },
    ]


def test_a_new_configuration_rolls_the_pods_a_new_key_does_not():
    def digest(spec: CpuLLMGatewaySpec) -> str:
        deployment = by_kind(decide_gateway(OWNER, spec, SERVICES, None, {}, IMAGE, T0))["Deployment"]
        return deployment["spec"]["template"]["metadata"]["annotations"]["cpullm.io/gateway-config"]

    assert digest(gateway_spec()) == digest(gateway_spec())
    assert digest(gateway_spec()) != digest(gateway_spec(maxConnections=64))
    # A key is a file the pods follow (GATEWAY_SCRIPT reloads HAProxy): the Secret's name alone is in the template.
    assert digest(gateway_spec()) == digest(gateway_spec(teams=[{"name": "team-a", "keySecret": {"name": "a-key"}}]))


@pytest.mark.parametrize(
    ("connections", "body", "memory"), [(256, 256 * 1024, 208), (16, 16 * 1024, 66), (64, 2**20, 196)]
)
def test_a_pods_memory_holds_two_buffers_a_connection(connections: int, body: int, memory: int):
    spec = gateway_spec(maxConnections=connections, maxRequestBytes=body)
    assert memory_bytes(spec, routes(spec, SERVICES)) == memory * 2**20
    # Two teams behind a full service: the hop from their slots to it holds connections too, both ends.
    two = gateway_spec(
        maxConnections=connections,
        maxRequestBytes=body,
        teams=[{"name": "a", "keySecret": {"name": "a"}}, {"name": "b", "keySecret": {"name": "b"}}],
    )
    routed = routes(two, {"chat": service("chat", "org/chat", seqs=4), "code": service("code", "org/code")})
    hop = 2 * (3 + 3)  # each team's ceiling on chat: 4 less a slot for the other
    assert memory_bytes(two, routed) - memory * 2**20 == pytest.approx(2 * hop * (body + 32 * 1024), abs=2**20)


def test_a_long_gateway_name_still_names_its_children_within_a_dns_label():
    owner = GatewayOwner("g" * 63, "teams", uid="u")
    name = gateway_name(owner)
    assert len(name) <= 63 and name.endswith("-gateway")


# -- status and events --------------------------------------------------------------------------------------------


def conditions(decision: Any) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in decision.status["conditions"]}


def test_status_says_what_is_routed_and_whether_a_pod_serves():
    decision = decide_gateway(OWNER, gateway_spec(), SERVICES, {"readyReplicas": 2}, {}, IMAGE, T0)
    assert conditions(decision) == {"Routed": ("True", "Routed"), "Ready": ("True", "GatewayReady")}
    assert decision.status["endpoint"] == "http://front-gateway.teams.svc.cluster.local:8000"
    assert decision.status["routes"][0] == {"model": "chat-lora", "service": "chat"}
    assert decision.status["observedGeneration"] == 3
    assert [(e.type, e.reason) for e in decision.events] == [("Normal", "Routed"), ("Normal", "GatewayReady")]
    again = decide_gateway(
        OWNER, gateway_spec(), SERVICES, {"readyReplicas": 2}, decision.status, IMAGE, T0 + timedelta(1)
    )
    assert again.events == () and again.status == decision.status  # nothing changed: no event, same times


def test_a_missing_service_is_routed_around_and_said():
    decision = decide_gateway(OWNER, gateway_spec(), {"chat": SERVICES["chat"]}, None, {}, IMAGE, T0)
    assert conditions(decision) == {"Routed": ("False", "ServicesMissing"), "Ready": ("False", "GatewayStarting")}
    routed = next(c for c in decision.status["conditions"] if c["type"] == "Routed")
    assert routed["message"] == "routes 2 model(s) of 1 service(s); service code not found in the gateway's namespace"
    assert decision.children  # what can be routed still is


def test_an_invalid_spec_renders_nothing_and_says_why():
    err = InvalidSpec("spec.teams: List should have at least 1 item")
    decision = decide_gateway(OWNER, err, SERVICES, None, {}, IMAGE, T0)
    assert decision.children == ()
    assert conditions(decision) == {"Routed": ("False", "InvalidSpec"), "Ready": ("False", "InvalidSpec")}
    assert (decision.status["routes"], decision.status["endpoint"]) == ([], None)  # what it routed before goes
    assert all(e.type == "Warning" for e in decision.events)


# -- the reconciler -----------------------------------------------------------------------------------------------


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Ownership] = {}
        self.writes: list[tuple[str, str]] = []
        self.statuses: list[Mapping[str, Any]] = []
        self.events: list[str] = []

    def apply(self, manifest: Mapping[str, Any], over: Ownership | None) -> dict[str, Any]:
        key = (manifest["kind"], manifest["metadata"]["name"])
        if over is None and key in self.objects:  # a create, where the object exists
            raise ChildExists(f"{key} exists")
        self.writes.append(("apply", key[0]))
        self.objects[key] = Ownership("o-" + key[0], manifest["metadata"]["ownerReferences"][0]["uid"], "1")
        return dict(manifest)

    def delete(self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str) -> None:
        found = self.objects.get((kind, name))
        if found is not None and found.controller_uid == owner_uid:
            self.writes.append(("delete", kind))
            del self.objects[(kind, name)]

    def ownership(self, api_version: str, kind: str, namespace: str, name: str) -> Ownership | None:
        return self.objects.get((kind, name))

    def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        assert plural == "cpullmgateways"
        self.statuses.append(status)

    def emit_event(self, regarding: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append(reason)


def body(**spec: Any) -> dict[str, Any]:
    raw = {"services": ["chat", "code"], "teams": [{"name": "team-a", "keySecret": {"name": "a"}}], **spec}
    return {"metadata": {"name": "front", "namespace": "teams", "uid": "g-1", "generation": 1}, "spec": raw}


def test_the_reconciler_writes_what_changed_and_reverts_on_a_forced_round():
    kube = FakeKube()
    reconciler = GatewayReconciler(kube, IMAGE, clock=lambda: T0)
    reconciler.reconcile(body(), SERVICES, None)
    assert sorted(kind for _, kind in kube.writes) == [
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
    ]
    assert len(kube.statuses) == 1 and kube.events == ["Routed", "GatewayStarting"]
    kube.writes.clear()
    reconciler.reconcile(body(), SERVICES, None)
    assert kube.writes == [] and len(kube.statuses) == 1  # nothing changed, nothing written
    reconciler.reconcile(body(), SERVICES, {"readyReplicas": 1})
    assert kube.writes == [] and len(kube.statuses) == 2 and kube.events[-1] == "GatewayReady"
    reconciler.reconcile(body(replicas=1), SERVICES, {"readyReplicas": 1})
    assert ("delete", "PodDisruptionBudget") in kube.writes and ("apply", "Deployment") in kube.writes
    kube.writes.clear()
    del kube.objects[("ConfigMap", "front-gateway")]  # someone deleted it
    reconciler.reconcile(body(replicas=1), SERVICES, {"readyReplicas": 1}, force=True)
    assert sorted(kube.writes) == [("apply", k) for k in ("ConfigMap", "Deployment", "NetworkPolicy", "Service")]


def test_a_same_name_object_someone_else_made_is_never_taken_over():
    kube = FakeKube()
    kube.objects[("Service", "front-gateway")] = Ownership("theirs", None, "7")
    decision = GatewayReconciler(kube, IMAGE, clock=lambda: T0).reconcile(body(), SERVICES, None)
    assert ("apply", "Service") not in kube.writes
    ready = next(c for c in kube.statuses[-1]["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], "Service teams/front-gateway exists and is not controlled" in ready["message"]) == (
        "Conflict",
        True,
    )
    assert not isinstance(decision, Exception)


def test_an_invalid_gateway_is_reported_without_writing_children():
    kube = FakeKube()
    GatewayReconciler(kube, IMAGE, clock=lambda: T0).reconcile(body(teams=[]), SERVICES, None)
    assert kube.writes == [] and kube.events == ["InvalidSpec", "InvalidSpec"]


def test_the_controller_finds_a_gateways_facts():
    assert controlling_gateway(
        "teams",
        {
            "ownerReferences": [
                {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMGateway", "name": "front", "controller": True}
            ]
        },
    ) == ("teams", "front")
    assert (
        controlling_gateway(
            "teams",
            {
                "ownerReferences": [
                    {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService", "name": "front", "controller": True}
                ]
            },
        )
        is None
    )
    assert fronts(body(), "chat") and not fronts(body(), "other") and not fronts({"spec": {"services": "chat"}}, "chat")
    index = {("teams", "chat"): [SERVICES["chat"]], ("other", "code"): [SERVICES["code"]]}
    assert namespace_services(index, "teams") == {"chat": SERVICES["chat"]}


def test_only_what_a_gateway_reads_of_a_service_is_news_for_it():
    reconciler = GatewayReconciler(FakeKube(), IMAGE, clock=lambda: T0)
    chat = service("chat", "org/chat", seqs=4)
    assert reconciler.service_news("teams", "chat", chat)  # first seen
    patched = {**chat, "status": {**chat["status"], "readyReplicas": 1, "conditions": [{"type": "Ready"}]}}
    assert not reconciler.service_news("teams", "chat", patched)  # its own status patch: not news
    assert reconciler.service_news("teams", "chat", service("chat", "org/chat", ("lora",), seqs=4))  # an adapter
    assert reconciler.service_news("teams", "chat", service("chat", "org/chat", ("lora",), seqs=8))  # capacity
    assert reconciler.service_news("teams", "chat", None) and reconciler.service_news("teams", "chat", chat)
