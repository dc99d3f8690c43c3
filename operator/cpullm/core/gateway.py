"""A CpuLLMGateway's children and status, decided from its spec and the services it fronts. Pure.

The gateway is HAProxy, as the router is (core/children/router.py): a proxy the field knows, with the pieces a front
door needs built in (a JSON reader for the request's `model`, maps, stick tables for rates, priority queues,
`http-request return` for OpenAI-shaped refusals, a Prometheus exporter, seamless reloads). Its keys never pass
through the operator: each team's Secret is mounted in the pods, whose start script (GATEWAY_SCRIPT) hashes the keys
into a map and reloads HAProxy when the kubelet updates a Secret; requests in flight finish on the old worker.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cpullm.api.crd import parse_stored_spec
from cpullm.api.gateway import KIND, ROUTED_NAME, CpuLLMGatewaySpec
from cpullm.core import constants as c
from cpullm.core.children.common import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    Owner,
    binary_quantity,
    owner_reference,
    suffixed_name,
)
from cpullm.core.children.disruption import PDB_API_VERSION
from cpullm.core.children.network_policy import NETWORK_POLICY_API_VERSION
from cpullm.core.children.router import PROXY_SECURITY_CONTEXT, apart
from cpullm.core.gateway_usage import GENERATED_ACTION, GENERATED_RETRY, USAGE_FILE, USAGE_LUA, USAGE_PATH
from cpullm.core.status import READY, condition
from cpullm.errors import CpuLLMError

GATEWAY_LABEL = "cpullm.io/gateway"
ROUTED = "Routed"
CONFIG_DIR = "/etc/cpullm-gateway"  # the ConfigMap: haproxy.cfg, the maps, each team's model list, the start script
KEYS_DIR = "/var/run/cpullm-gateway/keys"  # the teams' Secrets: a file per team, named after it
RUN_DIR = "/run/cpullm-gateway"  # an emptyDir: the keys' map and HAProxy's pid
HEALTH_PORT = 8404  # /ready, /live and HAProxy's Prometheus exporter (/metrics)
PORT_NAME = "http"
# Room in HAProxy's buffer beside the body: the request line and headers.
HEADER_ROOM = 32 * 1024
BASE_MEMORY = 64 * 2**20  # HAProxy's own memory beside its buffers
CPU_REQUEST = "100m"
# How long a request may run, where no fronted service's plan says (the router's bound, core/routing.py).
DEFAULT_DRAIN_SECONDS = c.DRAIN_MAX_SECONDS
# HAProxy's last priority class: where a request over its team's share waits.
LAST_CLASS = 2047
# A team's requests beyond its ceiling wait in a backend of their own, which passes the rest to the service's
# backend through a frontend on the pod's loopback; the request's priority class rides along in this header.
CLASS_HEADER = "x-cpullm-priority-class"
INNER_PORT_BASE = 10000
# The environment variable that carries a fronted service's API key into HAProxy's configuration.
SERVICE_KEY_ENV = "CPULLM_SERVICE_KEY_{index}"


@dataclass(frozen=True)
class Fronted:
    """A service the gateway sends requests to: the names it serves (its model, its adapters), its port, its API
    key's Secret (the gateway sends that key, as the servers keep their own guard), and how many requests its
    servers run at once (None: not known, nothing waits in the gateway)."""

    name: str
    models: tuple[str, ...]
    port: int
    api_key: tuple[str, str] | None = None
    capacity: int | None = None
    drain_seconds: int | None = None


@dataclass(frozen=True)
class Routes:
    """What the gateway routes: each model name to the service serving it, and why any listed service or name is
    left out."""

    services: tuple[Fronted, ...]
    model_service: Mapping[str, str]
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class GatewayOwner:
    name: str
    namespace: str
    uid: str | None = None
    generation: int = 0


@dataclass(frozen=True)
class GatewayEvent:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class GatewayDecision:
    children: tuple[dict[str, Any], ...]
    status: dict[str, Any]
    events: tuple[GatewayEvent, ...] = field(default=())


def fronted(body: Mapping[str, Any]) -> Fronted | str:
    """A CpuLLMService as the gateway routes to it, or why it cannot be (its spec is invalid)."""
    meta = body.get("metadata") or {}
    try:
        spec = parse_stored_spec(body.get("spec"))
    except CpuLLMError as err:
        return f"service {meta.get('name')}: its spec is invalid ({err.reason})"
    plan = (body.get("status") or {}).get("plan") or {}
    seqs, replicas = plan.get("maxNumSeqs"), spec.replicas
    saturation = (plan.get("predicted") or {}).get("saturationStreams")
    if isinstance(seqs, int) and isinstance(saturation, int) and saturation > 0:
        seqs = min(seqs, saturation)  # where a server is predicted to saturate, before its KV cache fills
    capacity = seqs * replicas if isinstance(seqs, int) and seqs > 0 and replicas > 0 else None
    drain = plan.get("drainSeconds")
    key = (spec.api_key_secret.name, spec.api_key_secret.key) if spec.api_key_secret else None
    return Fronted(
        name=str(meta.get("name")),
        models=(spec.model.name, *(a.name for a in spec.adapters or ())),
        port=spec.service.port,
        api_key=key,
        capacity=capacity,
        drain_seconds=drain if isinstance(drain, int) and drain > 0 else None,
    )


def routes(spec: CpuLLMGatewaySpec, services: Mapping[str, Mapping[str, Any]]) -> Routes:
    """Each listed service found in `services` (its namespace's, by name) and the names it serves; a name two
    services serve goes to the one listed first; a name HAProxy's files cannot hold is left out."""
    found: list[Fronted] = []
    model_service: dict[str, str] = {}
    problems: list[str] = []
    for name in spec.services:
        body = services.get(name)
        if body is None:
            problems.append(f"service {name} not found in the gateway's namespace")
            continue
        service = fronted(body)
        if isinstance(service, str):
            problems.append(service)
            continue
        found.append(service)
        for model in service.models:
            if len(model) > 1024 or not re.match(ROUTED_NAME, model):
                problems.append(f"service {name}: model name {model[:80]!r} cannot be routed (no spaces or quotes)")
            elif model in model_service:
                problems.append(f"{model} is served by {model_service[model]} and {name}: it goes to the first")
            else:
                model_service[model] = name
    return Routes(tuple(found), model_service, tuple(problems))


def gateway_name(owner: GatewayOwner) -> str:
    """The children's name: `<gateway>-gateway` (a DNS label, apart from any CpuLLMService's children)."""
    return suffixed_name(Owner(owner.name, owner.namespace), "gateway", 63)


def pod_selector(owner: GatewayOwner) -> dict[str, str]:
    return {GATEWAY_LABEL: owner.name}


def _metadata(owner: GatewayOwner) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": gateway_name(owner),
        "namespace": owner.namespace,
        "labels": {
            "app.kubernetes.io/name": "cpullm-gateway",
            "app.kubernetes.io/instance": owner.name,
            MANAGED_BY_LABEL: MANAGED_BY,
            GATEWAY_LABEL: owner.name,
        },
    }
    if owner.uid:
        meta["ownerReferences"] = [owner_reference(KIND, owner.name, owner.uid)]
    return meta


def backend_name(service: str) -> str:
    return f"svc-{service}"


def _error(status: int, kind: str, code: str, message: str, retry_after: str | None = None) -> str:
    """An `http-request return` of an OpenAI-shaped error (messages hold no single quote: HAProxy's quoting), with a
    Retry-After header where given (a log-format string: seconds, or a variable's %[...])."""
    body = json.dumps({"error": {"message": message, "type": kind, "code": code}}, separators=(",", ":"))
    header = f" hdr Retry-After {retry_after}" if retry_after is not None else ""
    return f"http-request return status {status}{header} content-type application/json string '{body}'"


def fronts(gateway: Mapping[str, Any], service: str) -> bool:
    """Whether a CpuLLMGateway object (as stored, perhaps invalid) lists `service` among those it fronts."""
    spec = gateway.get("spec") or {}
    services = spec.get("services") if isinstance(spec, Mapping) else None
    return isinstance(services, list) and service in services


def gateway_peer(names: Sequence[str]) -> dict[str, Any]:
    """A NetworkPolicy peer: the pods of these gateways (of the policy's namespace)."""
    match = {"key": GATEWAY_LABEL, "operator": "In", "values": sorted(names)}
    return {"podSelector": {"matchExpressions": [match]}}


def team_models(spec: CpuLLMGatewaySpec, model_service: Mapping[str, str]) -> dict[str, list[str]]:
    """The models each team may use that the gateway routes (a team's empty list: all of them)."""
    return {t.name: sorted(m for m in (t.models or model_service) if m in model_service) for t in spec.teams}


def models_document(models: Sequence[str]) -> str:
    """GET /v1/models for a team, as OpenAI's API answers it."""
    data = [{"id": m, "object": "model", "owned_by": "cpullm"} for m in models]
    return json.dumps({"object": "list", "data": data}, separators=(",", ":"))


def shares(spec: CpuLLMGatewaySpec, routed: Routes) -> dict[tuple[str, str], int]:
    """Each team's share of what each service's servers run at once (its capacity), by weight among the teams that
    may use the service: (team, service) -> requests in flight, at least one. Services of unknown capacity have none."""
    allowed = team_models(spec, routed.model_service)
    found: dict[tuple[str, str], int] = {}
    for service in routed.services:
        if not service.capacity:
            continue
        users = [t for t in spec.teams if any(routed.model_service[m] == service.name for m in allowed[t.name])]
        total = sum(t.weight for t in users)
        for team in users:
            found[(team.name, service.name)] = max(1, math.ceil(service.capacity * team.weight / total))
    return found


def ceilings(spec: CpuLLMGatewaySpec, routed: Routes) -> dict[tuple[str, str], int]:
    """The most requests each team may have running on each service at once, where that is less than its capacity:
    the capacity less a slot for each other team that may use the service, and never less than the team's share.
    A team flooding a full service leaves the others a free slot for their next request, which then waits for
    nobody; with more teams than slots, each keeps to its share."""
    share = shares(spec, routed)
    found: dict[tuple[str, str], int] = {}
    for service in routed.services:
        users, capacity = [t.name for t in spec.teams if (t.name, service.name) in share], service.capacity or 0
        for team in users:
            ceiling = max(share[(team, service.name)], capacity - (len(users) - 1))
            if ceiling < capacity:
                found[(team, service.name)] = ceiling
    return found


def slot_backend(team: str, service: str) -> str:
    """Where a team's requests to a service wait beyond its ceiling (':' is in no Kubernetes name)."""
    return f"slot:{team}:{service}"


def _inner_ports(spec: CpuLLMGatewaySpec, count: int) -> list[int]:
    """Loopback ports of the services' inner frontends, clear of the gateway's own."""
    taken = {spec.port, HEALTH_PORT}
    return [port for port in range(INNER_PORT_BASE, INNER_PORT_BASE + count + len(taken)) if port not in taken][:count]


def hop_connections(slots: Mapping[tuple[str, str], int]) -> int:
    """The connections the hop from the teams' slots (`ceilings`) to the services can hold at most (both ends)."""
    return 2 * sum(slots.values())


def _over_share(spec: CpuLLMGatewaySpec, routed: Routes) -> list[str]:
    """A request that takes its team over its share of a service's capacity (its in-flight requests, tracked in
    team_rates) waits after every other, whatever the team's priority: when the servers are full, a flooding team
    queues behind the others' requests, not in front of them."""
    return [
        f"  http-request set-priority-class int({LAST_CLASS}) if {{ var(txn.team) -m str {team} }}"
        f" {{ var(txn.backend) -m str {backend_name(service)} }} {{ sc_conn_cur(0) gt {share} }}"
        for (team, service), share in sorted(shares(spec, routed).items())
    ]


def _generated_limits(spec: CpuLLMGatewaySpec) -> list[str]:
    """Each team's generatedTokensPerMinute, shared out among the replicas: the usage filter's counts of the last
    minute (core/gateway_usage.py) at the limit, 429 with Retry-After until the oldest of them leave it."""
    lines = []
    for team in spec.teams:
        if team.generated_tokens_per_minute is None:
            continue
        share = math.ceil(team.generated_tokens_per_minute / spec.replicas)
        lines.append(f"  http-request lua.{GENERATED_ACTION} {share} if {{ var(txn.team) -m str {team.name} }}")
    if lines:
        message, retry = "the team is over its generated tokens a minute", f"%[var({GENERATED_RETRY})]"
        refusal = _error(429, "rate_limit_exceeded", "rate_limit_exceeded", message, retry)
        lines.append(f"  {refusal} if {{ var({GENERATED_RETRY}) -m found }}")
    return lines


def _slots(spec: CpuLLMGatewaySpec, slots: Mapping[tuple[str, str], int]) -> list[str]:
    """Each team's slot backend (at most its ceiling at once; the rest wait there, in arrival order), and for each
    service behind slots a loopback frontend into its backend, where the request's priority class applies again."""
    behind = sorted({service for _, service in slots})
    ports = dict(zip(behind, _inner_ports(spec, len(behind)), strict=True))
    lines = []
    for (team, service), ceiling in sorted(slots.items()):
        lines += [
            f"backend {slot_backend(team, service)}",
            f"  server {service} 127.0.0.1:{ports[service]} maxconn {ceiling}",
            "",
        ]
    for service in behind:
        lines += [
            f"frontend inner-{service}",
            f"  bind 127.0.0.1:{ports[service]}",
            f"  http-request set-priority-class req.hdr({CLASS_HEADER}) if {{ req.hdr({CLASS_HEADER}) -m found }}",
            f"  default_backend {backend_name(service)}",
            "",
        ]
    return lines


def drain_seconds(found: Sequence[Fronted]) -> int:
    """The longest a request through the gateway may run: the longest of the fronted services' plans."""
    return max((s.drain_seconds or DEFAULT_DRAIN_SECONDS for s in found), default=DEFAULT_DRAIN_SECONDS)


def haproxy_config(owner: GatewayOwner, spec: CpuLLMGatewaySpec, routed: Routes) -> str:
    """HAProxy's configuration: a team's key (hashed, looked up in the keys' map) or 401; GET /v1/models answered
    from the team's list; the team's rate or 429; the body's `model` or 400 (413 over maxRequestBytes); a model
    no service serves 404, one the team may not use 403; then the service's backend, where requests over what its
    servers run at once wait, highest priority first."""
    seconds, entries = max(drain_seconds(routed.services), 1), max(len(spec.teams) * 2, 16)
    slots = ceilings(spec, routed)
    lines = [
        "global",
        f"  maxconn {spec.max_connections + hop_connections(slots)}",
        f"  tune.bufsize {spec.max_request_bytes + HEADER_ROOM}",
        f"  hard-stop-after {seconds}s",
        f"  lua-load {CONFIG_DIR}/{USAGE_FILE}",
        # The listening sockets pass to the new worker on a reload: no connection waiting to be accepted is lost.
        f"  stats socket {RUN_DIR}/haproxy.sock mode 600 level user expose-fd listeners",
        # One thread: plenty for requests that each take seconds of a server, and the usage filter's Lua state is
        # never shared (with two, HAProxy 2.6.12's Lua filter failed calls after a reload: "attempt to index a
        # thread value").
        "  nbthread 1",
        "defaults",
        "  mode http",
        "  option http-buffer-request",
        "  timeout connect 5s",
        "  timeout http-request 30s",
        f"  timeout client {seconds}s",
        f"  timeout server {seconds}s",
        f"  timeout queue {seconds}s",
        "resolvers cluster",
        "  parse-resolv-conf",
        "  hold valid 5s",
        "backend team_rates",
        f"  stick-table type string len 64 size {entries} expire 2m store http_req_rate(60s),conn_cur",
        "frontend health",
        f"  bind :{HEALTH_PORT}",
        "  monitor-uri /ready",
        "  http-request return status 200 if { path /live }",
        "  http-request use-service prometheus-exporter if { path /metrics }",
        f"  http-request use-service lua.usage if {{ path {USAGE_PATH} }}",
        "frontend api",
        f"  bind :{spec.port}",
        "  filter lua.usage",
        f"  http-request del-header {CLASS_HEADER}",
        '  http-request set-var(txn.key) req.hdr(authorization),regsub("^[Bb]earer +","")',
        f"  http-request set-var(txn.team) var(txn.key),sha2(256),hex,lower,map({RUN_DIR}/keys.map)",
        "  "
        + _error(401, "invalid_request_error", "invalid_api_key", "a team key is needed: Authorization: Bearer")
        + " unless { var(txn.team) -m found }",
    ]
    for team in spec.teams:
        lines.append(
            f"  http-request return status 200 content-type application/json file {CONFIG_DIR}/models-{team.name}.json"
            f" if {{ method GET }} {{ path /v1/models }} {{ var(txn.team) -m str {team.name} }}"
        )
    lines.append("  http-request track-sc0 var(txn.team) table team_rates")
    for team in spec.teams:
        if team.requests_per_minute is None:
            continue
        share = math.ceil(team.requests_per_minute / spec.replicas)  # each replica admits its part
        retry = max(1, math.ceil(60 / share))
        refusal = _error(
            429, "rate_limit_exceeded", "rate_limit_exceeded", f"team {team.name} is over its rate", str(retry)
        )
        lines.append(f"  {refusal} if {{ var(txn.team) -m str {team.name} }} {{ sc_http_req_rate(0) gt {share} }}")
    lines += _generated_limits(spec)
    limit = spec.max_request_bytes
    lines += [
        "  "
        + _error(413, "invalid_request_error", "request_too_large", f"the body is over {limit} bytes")
        + f" if {{ req.body_size gt {limit} }}",
        "  http-request set-var(txn.model) req.body,json_query('$.model')",
        "  "
        + _error(400, "invalid_request_error", "model_missing", "the request names no model")
        + " unless { var(txn.model) -m found }",
        f"  http-request set-var(txn.backend) var(txn.model),map({CONFIG_DIR}/models.map)",
        "  "
        + _error(404, "invalid_request_error", "model_not_found", "no such model behind this gateway")
        + " unless { var(txn.backend) -m found }",
        f"  http-request set-var(txn.granted) var(txn.team),concat(/,txn.model),map({CONFIG_DIR}/grants.map)",
        "  "
        + _error(403, "invalid_request_error", "model_not_allowed", "this team may not use that model")
        + " unless { var(txn.granted) -m found }",
    ]
    for team in spec.teams:
        if team.priority:
            lines.append(
                f"  http-request set-priority-class int({-team.priority}) if {{ var(txn.team) -m str {team.name} }}"
            )
    lines += _over_share(spec, routed)
    lines.append("  http-request set-var(txn.routed) bool(true)")
    if slots:
        lines.append(f"  http-request set-header {CLASS_HEADER} %[prio_class]")
    lines += [
        f"  use_backend {slot_backend(team, service)} if {{ var(txn.team) -m str {team} }}"
        f" {{ var(txn.backend) -m str {backend_name(service)} }}"
        for team, service in sorted(slots)
    ]
    lines += ["  use_backend %[var(txn.backend)]", ""]
    lines += _slots(spec, slots)
    for index, service in enumerate(routed.services):
        host = f"{service.name}.{owner.namespace}.svc.{spec.cluster_domain}"
        seqs = f" maxconn {service.capacity}" if service.capacity else ""
        lines += [f"backend {backend_name(service.name)}", f"  http-request del-header {CLASS_HEADER}"]
        if service.api_key is not None:  # the servers keep their own guard: the gateway sends their key
            env = SERVICE_KEY_ENV.format(index=index)
            lines.append(f'  http-request set-header authorization "Bearer ${{{env}}}"')
        else:
            lines.append("  http-request del-header authorization")  # a team's key goes no further
        lines.append(f"  server {service.name} {host}:{service.port} resolvers cluster init-addr last,libc,none{seqs}")
    return "\n".join(lines) + "\n"


# Run by the gateway's container: the keys' map from the mounted Secrets (a SHA-256 of each key, never the key),
# HAProxy in master-worker mode, and a reload (SIGUSR2: a new worker takes the listeners, the old one finishes what
# it holds) whenever the kubelet changes a Secret's files. SIGTERM and SIGUSR1 stop HAProxy softly.
GATEWAY_SCRIPT = (
    """#!/bin/sh
set -u
keys=${CPULLM_GATEWAY_KEYS:-@KEYS@}
run=${CPULLM_GATEWAY_RUN:-@RUN@}
config=${CPULLM_GATEWAY_CONFIG:-@CONFIG@}
keys_map() {
  : >"$run/keys.map.new"
  for file in "$keys"/*; do
    [ -f "$file" ] || continue
    team=${file##*/} found=
    while IFS= read -r key || [ -n "$key" ]; do  # a key a line: during a rotation, the old one and the new
      [ -n "$key" ] || continue
      printf '%s %s\\n' "$(printf %s "$key" | sha256sum | cut -c1-64)" "$team" >>"$run/keys.map.new"
      found=1
    done <"$file"
    [ -n "$found" ] || echo "gateway: team $team has no key: not admitted" >&2
  done
  mv "$run/keys.map.new" "$run/keys.map"
}
state() { cat "$keys"/* 2>/dev/null | sha256sum; }
keys_map
seen=$(state)
haproxy -W -db -f "$config/haproxy.cfg" -p "$run/haproxy.pid" &
pid=$!
trap 'kill -USR1 "$pid" 2>/dev/null' TERM USR1
while kill -0 "$pid" 2>/dev/null; do
  sleep 2 &
  wait $! 2>/dev/null
  now=$(state)
  if [ "$now" != "$seen" ]; then
    keys_map
    seen=$now
    echo "gateway: keys changed, reloading" >&2
    kill -USR2 "$pid" 2>/dev/null
  fi
done
wait "$pid"
""".replace("@KEYS@", KEYS_DIR)
    .replace("@RUN@", RUN_DIR)
    .replace("@CONFIG@", CONFIG_DIR)
)


def config_files(owner: GatewayOwner, spec: CpuLLMGatewaySpec, routed: Routes) -> dict[str, str]:
    """The ConfigMap's files: HAProxy's configuration, the model and grant maps, a model list per team, the script."""
    allowed = team_models(spec, routed.model_service)
    files = {
        "haproxy.cfg": haproxy_config(owner, spec, routed),
        "models.map": "".join(f"{m} {backend_name(s)}\n" for m, s in sorted(routed.model_service.items())),
        "grants.map": "".join(f"{team}/{m} 1\n" for team, models in sorted(allowed.items()) for m in models),
        "start.sh": GATEWAY_SCRIPT,
        USAGE_FILE: USAGE_LUA,
    }
    files.update({f"models-{team}.json": models_document(models) for team, models in allowed.items()})
    return files


def memory_bytes(spec: CpuLLMGatewaySpec, routed: Routes) -> int:
    """What a gateway pod may use: HAProxy's own, and two buffers for each connection it holds, the hop's included
    (rounded to MiB)."""
    connections = spec.max_connections + hop_connections(ceilings(spec, routed))
    total = BASE_MEMORY + 2 * connections * (spec.max_request_bytes + HEADER_ROOM)
    return math.ceil(total / 2**20) * 2**20


def build_children(owner: GatewayOwner, spec: CpuLLMGatewaySpec, routed: Routes, image: str) -> list[dict[str, Any]]:
    """The ConfigMap, Deployment, Service and NetworkPolicy, and a PodDisruptionBudget for more than one pod."""
    meta, pods = _metadata(owner), pod_selector(owner)
    files = config_files(owner, spec, routed)
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    children: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": files},
        _deployment(owner, spec, routed, image, digest),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "selector": pods,
                "ports": [{"name": PORT_NAME, "port": spec.port, "targetPort": PORT_NAME, "protocol": "TCP"}],
            },
        },
        _network_policy(meta, spec, pods),
    ]
    if spec.replicas > 1:
        children.append(
            {
                "apiVersion": PDB_API_VERSION,
                "kind": "PodDisruptionBudget",
                "metadata": meta,
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pods}},
            }
        )
    return children


def _network_policy(meta: Mapping[str, Any], spec: CpuLLMGatewaySpec, pods: Mapping[str, str]) -> dict[str, Any]:
    """Requests from allowedFrom (default: every pod of the cluster) on the API port, scrapes from metricsFrom on the
    metrics port; the kubelet's probes come from the node, which NetworkPolicy always admits."""

    def dump(peers: Sequence[Any]) -> list[dict[str, Any]]:
        return [p.model_dump(by_alias=True, exclude_defaults=True) for p in peers]

    callers = [{"namespaceSelector": {}}] if spec.allowed_from is None else dump(spec.allowed_from)
    rules = [(callers, spec.port), (dump(spec.metrics_from), HEALTH_PORT)]
    ingress = [{"from": peers, "ports": [{"protocol": "TCP", "port": port}]} for peers, port in rules if peers]
    return {
        "apiVersion": NETWORK_POLICY_API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {"podSelector": {"matchLabels": dict(pods)}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _deployment(
    owner: GatewayOwner, spec: CpuLLMGatewaySpec, routed: Routes, image: str, digest: str
) -> dict[str, Any]:
    name, pods = gateway_name(owner), pod_selector(owner)
    memory = binary_quantity(memory_bytes(spec, routed))
    keys = [
        {
            "secret": {
                "name": team.key_secret.name,
                "optional": True,  # a team whose Secret is missing is not admitted; the others are
                "items": [{"key": team.key_secret.key, "path": team.name}],
            }
        }
        for team in spec.teams
    ]
    env = [
        {
            "name": SERVICE_KEY_ENV.format(index=index),
            "valueFrom": {"secretKeyRef": {"name": service.api_key[0], "key": service.api_key[1]}},
        }
        for index, service in enumerate(routed.services)
        if service.api_key is not None
    ]
    container: dict[str, Any] = {
        "name": "haproxy",
        "image": image,
        "command": ["/bin/sh", f"{CONFIG_DIR}/start.sh"],
        "ports": [
            {"name": PORT_NAME, "containerPort": spec.port, "protocol": "TCP"},
            {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": {"cpu": CPU_REQUEST, "memory": memory}, "limits": {"memory": memory}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "health"}, "periodSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/live", "port": "health"}, "periodSeconds": 10, "failureThreshold": 3},
        "lifecycle": {"preStop": {"sleep": {"seconds": c.DRAIN_SETTLE_SECONDS}}},
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
            {"name": "run", "mountPath": RUN_DIR},
        ],
        "securityContext": PROXY_SECURITY_CONTEXT,
    }
    if env:
        container["env"] = env
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": name}},
            {"name": "keys", "projected": {"sources": keys}},
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        ],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "affinity": apart(pods),
        "terminationGracePeriodSeconds": drain_seconds(routed.services) + c.DRAIN_SETTLE_SECONDS,
    }
    labels = {**_metadata(owner)["labels"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": pods},
            "template": {
                # A new configuration rolls the pods (a key does not: the script reloads HAProxy for it).
                "metadata": {"labels": labels, "annotations": {"cpullm.io/gateway-config": digest}},
                "spec": pod_spec,
            },
        },
    }


def decide_gateway(
    owner: GatewayOwner,
    spec: CpuLLMGatewaySpec | CpuLLMError,
    services: Mapping[str, Mapping[str, Any]],
    deployment_status: Mapping[str, Any] | None,
    previous: Mapping[str, Any],
    image: str,
    now: datetime,
) -> GatewayDecision:
    """Children, status and events for a gateway: `services` are its namespace's CpuLLMServices by name,
    `deployment_status` its Deployment's status (None: absent), `previous` its status as last written, `image` the
    operator's router image (a spec that names none)."""
    before = previous.get("conditions") or []
    if isinstance(spec, CpuLLMError):
        conditions = [
            condition(ROUTED, False, spec.reason, spec.message, owner.generation, now, before),
            condition(READY, False, spec.reason, f"nothing is served: {spec.message}", owner.generation, now, before),
        ]
        # Merge-patched: null and [] clear what an earlier status said it routed.
        status: dict[str, Any] = {
            "observedGeneration": owner.generation,
            "endpoint": None,
            "routes": [],
            "conditions": conditions,
        }
        return GatewayDecision((), status, _events(before, conditions))
    routed = routes(spec, services)
    children = build_children(owner, spec, routed, spec.image or image)
    count = f"{len(routed.model_service)} model(s) of {len(routed.services)} service(s)"
    routed_condition = (
        condition(ROUTED, True, "Routed", f"routes {count}", owner.generation, now, before)
        if not routed.problems
        else condition(
            ROUTED,
            False,
            "ServicesMissing",
            f"routes {count}; " + "; ".join(routed.problems),
            owner.generation,
            now,
            before,
        )
    )
    ready = int((deployment_status or {}).get("readyReplicas") or 0)
    ready_condition = condition(
        READY,
        ready > 0,
        "GatewayReady" if ready > 0 else "GatewayStarting",
        f"{ready} of {spec.replicas} gateway pod(s) ready",
        owner.generation,
        now,
        before,
    )
    conditions = [routed_condition, ready_condition]
    endpoint = f"http://{gateway_name(owner)}.{owner.namespace}.svc.{spec.cluster_domain}:{spec.port}"
    status = {
        "observedGeneration": owner.generation,
        "endpoint": endpoint,
        "readyReplicas": ready,
        "routes": [{"model": m, "service": s} for m, s in sorted(routed.model_service.items())],
        "conditions": conditions,
    }
    return GatewayDecision(tuple(children), status, _events(before, conditions))


def _events(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> tuple[GatewayEvent, ...]:
    """An event for each condition whose status or reason changed."""
    old = {c.get("type"): (c.get("status"), c.get("reason")) for c in before}
    return tuple(
        GatewayEvent("Normal" if c["status"] == "True" else "Warning", c["reason"], c["message"])
        for c in after
        if old.get(c["type"]) != (c["status"], c["reason"])
    )
