"""The router in front of a service's servers (spec.routing mode router): HAProxy balancing by least connections,
so each request goes to the server holding the fewest in flight (or, with prefix affinity, a conversation's to the
server that served it), where kube-proxy would pick one per connection at random. Three children: HAProxy's
configuration (a ConfigMap), its Deployment, and a headless Service whose DNS answer lists the ready servers
(HAProxy re-resolves it every second: servers joining, leaving and draining are followed without a reload). The
service's own Service then selects the router's pods.
"""

from __future__ import annotations

import hashlib
from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec, RouterAffinity, RouterSettings, RoutingMode
from cpullm.core import constants as c
from cpullm.core.children.common import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PORT_NAME,
    Owner,
    metadata,
    selector,
    suffixed_name,
)
from cpullm.core.children.drain import grace_seconds

ROUTER_LABEL = "cpullm.io/router"
CONFIG_FILE = "haproxy.cfg"
CONFIG_MOUNT = "/etc/cpullm-router"
HEALTH_PORT = 8404  # the router's own /ready (at least one server up), /live and /metrics
HEALTH_PORT_NAME = "health"
# A service runs at most 1,000 servers (spec.replicas): no more slots than that (13 MB of HAProxy's memory).
MAX_SERVER_SLOTS = 1000
# Nobody: HAProxy needs no user of its own when it neither chroots nor binds a port below 1024.
NOBODY = 65534
# HAProxy's container, the router's and a gateway's: no privilege, no capability, nothing written but its volumes.
PROXY_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": NOBODY,
    "runAsGroup": NOBODY,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def apart(pods: dict[str, str]) -> dict[str, Any]:
    """An affinity that places the pods `pods` selects on different nodes where it can."""
    term = {"labelSelector": {"matchLabels": pods}, "topologyKey": "kubernetes.io/hostname"}
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    }


def uses_router(plan: Plan) -> bool:
    return plan.routing == RoutingMode.ROUTER


def router_name(owner: Owner) -> str:
    return f"{owner.name}-router"


def servers_service_name(owner: Owner) -> str:
    """The headless Service listing the servers (a Service name: a DNS label of at most 63 characters)."""
    return suffixed_name(owner, "servers", 63)


def router_selector(owner: Owner) -> dict[str, str]:
    return {ROUTER_LABEL: owner.name}


def haproxy_config(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> str:
    """HAProxy's configuration. Each request waits as long as the longest one may run (plan.drainSeconds); a
    server slot for each server the chosen nodes can hold (plan.capacity: the same as the service scales, so
    scaling never rolls the router); with maxNumSeqs (set, or chosen by the plan), no server is sent more than it
    runs at once, and the rest queue in the router for the first one free (or, with prefix affinity, for their
    conversation's server while it holds no more than its bound)."""
    port, seconds = spec.service.port, max(plan.drain_seconds, 1)
    domain = spec.routing.router.cluster_domain
    servers = f"{servers_service_name(owner)}.{owner.namespace}.svc.{domain}"
    per_server = _server_bound(spec.routing.router, plan.max_num_seqs)
    return "\n".join(
        [
            "global",
            "  maxconn 4096",
            f"  hard-stop-after {seconds}s",
            "defaults",
            "  mode http",
            "  timeout connect 5s",
            "  timeout http-request 30s",
            f"  timeout client {seconds}s",
            f"  timeout server {seconds}s",
            f"  timeout queue {seconds}s",
            "  retries 2",
            "  retry-on conn-failure empty-response",
            "  option redispatch",
            "resolvers cluster",
            "  parse-resolv-conf",
            "  timeout resolve 1s",
            "  timeout retry 1s",
            "  hold valid 5s",
            "  accepted_payload_size 8192",
            "frontend api",
            f"  bind :{port}",
            "  default_backend servers",
            "frontend health",
            f"  bind :{HEALTH_PORT}",
            "  monitor-uri /ready",
            "  monitor fail if { nbsrv(servers) eq 0 }",
            "  http-request return status 200 if { path /live }",
            "  http-request use-service prometheus-exporter if { path /metrics }",
            "backend servers",
            *_balance(spec.routing.router),
            "  option httpchk GET /health",
            f"  default-server check inter 2s fall 2 rise 1 resolvers cluster init-addr none{per_server}",
            f"  server-template server 1-{min(max(plan.capacity, 1), MAX_SERVER_SLOTS)} {servers}:{port}",
            "",
        ]
    )


# The affinity key's sources, first found wins: the client's session header (where the spec names one), the first
# user message of a chat (after a system prompt, where the first message is one), a completion's prompt (its first
# PROMPT_KEY_BYTES: a later turn repeats the earlier text first). HAProxy's json_query reads the buffered body.
PROMPT_KEY_BYTES = 256
# The stick table: a conversation's key (its SHA-1) and the server that served it last, forgotten after STICK_EXPIRE
# unused (vLLM's prefix cache has evicted it by then on a busy server); STICK_ENTRIES conversations at most, the
# oldest dropped first (a flood of new keys costs affinity, never memory): 13 MB full in HAProxy 2.6, measured.
STICK_ENTRIES, STICK_EXPIRE = 65536, "30m"


def _balance(router: RouterSettings) -> list[str]:
    """How the backend picks a server: the one with the fewest requests in flight; with prefix affinity, a known
    conversation's request goes to the server that served its last one (a stick table of its key). Requests
    without a key (no body, no text) are balanced alone. The bound on a conversation's server is per server
    (_server_bound)."""
    if router.affinity == RouterAffinity.NONE:
        return ["  balance leastconn"]
    key, found = "txn.affinity", "{ var(txn.affinity) -m found }"
    lines = ["  balance leastconn", "  option http-buffer-request"]
    if router.session_header:
        header = router.session_header.lower()
        lines.append(f"  http-request set-var({key}) req.hdr({header}) if {{ req.hdr({header}) -m found }}")
    lines += [
        f"  http-request set-var(txn.first_role) req.body,json_query('$.messages[0].role') unless {found}",
        f"  http-request set-var({key}) req.body,json_query('$.messages[1].content') if !{found} "
        "{ var(txn.first_role) -m str system }",
        f"  http-request set-var({key}) req.body,json_query('$.messages[0].content') unless {found}",
        f"  http-request set-var({key}) req.body,json_query('$.prompt'),bytes(0,{PROMPT_KEY_BYTES}) unless {found}",
        f"  stick-table type binary len 20 size {STICK_ENTRIES} expire {STICK_EXPIRE}",
        f"  stick on var({key}),sha1",
    ]
    return lines


def _server_bound(router: RouterSettings, max_num_seqs: int | None) -> str:
    """Each server's limits: it runs at most maxNumSeqs requests at once (maxconn; the rest wait in the router).
    With prefix affinity, at most loadFactor percent of that may be held for it (running and waiting, maxqueue for
    the waiting part): past it a conversation's request goes to the least busy server, which then holds the
    conversation (HAProxy breaks persistence at maxqueue). No maxNumSeqs: no limit, and no bound."""
    if not max_num_seqs:
        return ""
    if router.affinity == RouterAffinity.NONE:
        return f" maxconn {max_num_seqs}"
    waiting = max(1, -(-max_num_seqs * (router.load_factor - 100) // 100))
    return f" maxconn {max_num_seqs} maxqueue {waiting}"


def build_router_config_map(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    if not uses_router(plan):
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**metadata(owner), "name": router_name(owner)},
        "data": {CONFIG_FILE: haproxy_config(owner, spec, plan)},
    }


def build_servers_service(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    """Headless: its DNS name resolves to the ready servers' addresses (a terminating one leaves at once)."""
    if not uses_router(plan):
        return None
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {**metadata(owner), "name": servers_service_name(owner)},
        "spec": {
            "clusterIP": "None",
            "selector": selector(owner),
            "ports": [{"name": PORT_NAME, "port": spec.service.port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }


def build_router_deployment(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    if not uses_router(plan):
        return None
    router = spec.routing.router
    config = haproxy_config(owner, spec, plan)
    pod_labels = {
        "app.kubernetes.io/name": "haproxy",
        "app.kubernetes.io/instance": owner.name,
        MANAGED_BY_LABEL: MANAGED_BY,
        **router_selector(owner),
    }
    http = {"path": "/ready", "port": HEALTH_PORT_NAME}
    container: dict[str, Any] = {
        "name": "haproxy",
        "image": plan.router_image,
        "command": ["haproxy", "-W", "-db", "-f", f"{CONFIG_MOUNT}/{CONFIG_FILE}"],
        "ports": [
            {"name": PORT_NAME, "containerPort": spec.service.port, "protocol": "TCP"},
            {"name": HEALTH_PORT_NAME, "containerPort": HEALTH_PORT, "protocol": "TCP"},
        ],
        # No CPU limit: a throttled proxy would delay every token it passes.
        "resources": {
            "requests": {
                "cpu": f"{plan.router_cpu_millis}m" if plan.router_cpu_millis else "0",
                "memory": router.memory,
            },
            "limits": {"memory": router.memory},
        },
        "readinessProbe": {"httpGet": http, "periodSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {**http, "path": "/live"}, "periodSeconds": 10, "failureThreshold": 3},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True}],
        "lifecycle": {"preStop": {"sleep": {"seconds": c.DRAIN_SETTLE_SECONDS}}},
        "securityContext": PROXY_SECURITY_CONTEXT,
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": router_name(owner)}}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        # Replicas apart: each node leaves room for one router pod (core/routing.py).
        "affinity": apart(router_selector(owner)),
        # A stopping router leaves the endpoints first, then finishes what it holds: HAProxy stops softly on the
        # image's stop signal (SIGUSR1 in HAProxy's images), at most drainSeconds later (hard-stop-after).
        "terminationGracePeriodSeconds": grace_seconds(plan),
    }
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**metadata(owner), "name": router_name(owner)},
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": router_selector(owner)},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    # A new configuration rolls the router (a ConfigMap change alone would not reach HAProxy).
                    "annotations": {"cpullm.io/router-config": hashlib.sha256(config.encode()).hexdigest()[:16]},
                },
                "spec": pod_spec,
            },
        },
    }
