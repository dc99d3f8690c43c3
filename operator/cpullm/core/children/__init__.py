"""The objects the operator owns per CpuLLMService, each built by one pure function in its own module.

A new owned child is a new module here with a `build_*` function added to CHILDREN and its kind's line in
CHILD_KINDS; what the rest of the operator needs of a kind (the API calls, the watches, the resync, the
optional APIs' conditions, what a spec can stop asking for) derives from that line, and so do the chart's RBAC and
admission policies for it (`cpullm chart-kinds` regenerates their list, files/owned-kinds.json).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.api_resources import ApiResource
from cpullm.core.children.autoscaler import (
    HPA_API_VERSION,
    SCALEDOBJECT_API_VERSION,
    build_autoscaler,
    wants_hpa,
    wants_scaled_object,
)
from cpullm.core.children.common import ChildBuilder, Owner
from cpullm.core.children.deployment import build_deployment
from cpullm.core.children.disruption import PDB_API_VERSION, build_disruption_budget
from cpullm.core.children.inferencepool import (
    HTTPROUTE_API_VERSION,
    INFERENCEPOOL_API_VERSION,
    build_http_route,
    build_inference_pool,
    wants_http_route,
    wants_inference_pool,
)
from cpullm.core.children.launcher import build_launcher_config_map, launcher_config_map_name
from cpullm.core.children.network_policy import (
    NETWORK_POLICY_API_VERSION,
    build_router_network_policy,
    build_servers_network_policy,
)
from cpullm.core.children.podmonitor import PODMONITOR_API_VERSION, build_pod_monitor, wants_pod_monitor
from cpullm.core.children.router import build_router_config_map, build_router_deployment, build_servers_service
from cpullm.core.children.service import build_service

CHILDREN: tuple[ChildBuilder, ...] = (
    build_servers_network_policy,  # before the servers: no pod of theirs is reachable without it
    build_router_network_policy,
    build_launcher_config_map,  # what the pods mount
    build_router_config_map,
    build_disruption_budget,
    build_servers_service,
    build_service,
    # The servers after the names someone else may hold: a first write finds a taken name by writing
    # (controller/owned.py), and no server starts for a service that is a conflict.
    build_deployment,
    build_router_deployment,  # after the servers it sends requests to
    build_inference_pool,
    build_http_route,
    build_pod_monitor,
    build_autoscaler,
)


@dataclass(frozen=True)
class ChildKind(ApiResource):
    """An owned kind, and how the operator handles it."""

    # Watched (drift reverted, readiness copied): the children every service has. The resync lists every served
    # kind, watched or not.
    watched: bool = False
    # The CRD that serves it, when its API is not built into Kubernetes: applied only where it is installed,
    # elsewhere its condition says what to install.
    crd: str | None = None
    # The condition reporting it, for the kinds a spec asks for as a feature; and what installs its CRD.
    condition: str | None = None
    installer: str = ""
    # For the kinds a spec asks for as a feature: whether this spec and plan ask for one (what its builder builds
    # on), read without building it (core/affected.py: which services a CRD's arrival concerns).
    wanted: Callable[[CpuLLMServiceSpec, Plan], bool] | None = None
    # An obsolete one is deleted before the service's children are written, because what replaces it may be
    # refused while it exists (KEDA's admission webhook refuses a ScaledObject beside an HPA of the same target).
    # Every other obsolete child goes after the writes, so what takes its place is there first: routed through
    # the Service again, the Service selects the servers (and their policy admits the namespace) before the
    # router goes.
    deleted_before_writes: bool = False
    # Kept as a plan builds it: re-applied when another writer changed or deleted it (the resync lists the kind),
    # deleted when the spec stops asking for it. False: made once and left for Kubernetes to remove (a sizing Job).
    kept: bool = True
    # It holds a pod template: the chart's policy on the operator's pods checks what the template may do.
    pod_template: bool = False

    @property
    def verbs(self) -> tuple[str, ...]:
        """What the operator does with it: server-side apply (create + patch), a read before an apply or delete,
        a delete once the spec stops asking for it and the resync's metadata list (kept), and a watch (watched)."""
        kept = ("delete", "list") if self.kept else ()
        return ("get", "create", "patch", *kept, *(("watch",) if self.watched else ()))


CHILD_KINDS: tuple[ChildKind, ...] = (
    ChildKind("v1", "ConfigMap", "configmaps", watched=True),
    ChildKind("apps/v1", "Deployment", "deployments", watched=True, pod_template=True),
    ChildKind("v1", "Service", "services", watched=True),
    ChildKind(PDB_API_VERSION, "PodDisruptionBudget", "poddisruptionbudgets"),
    # A sizing Job (core/children/sizing_job.py), only while vLLM sizes a model: created by a reconcile that needs
    # it, removed by Kubernetes' TTL after it finished; not one of the children a plan builds.
    ChildKind("batch/v1", "Job", "jobs", kept=False, pod_template=True),
    ChildKind(NETWORK_POLICY_API_VERSION, "NetworkPolicy", "networkpolicies"),
    ChildKind(
        INFERENCEPOOL_API_VERSION,
        "InferencePool",
        "inferencepools",
        crd="inferencepools.inference.networking.k8s.io",
        condition="Routing",
        installer="the Gateway API Inference Extension",
        wanted=wants_inference_pool,
    ),
    ChildKind(
        HTTPROUTE_API_VERSION,
        "HTTPRoute",
        "httproutes",
        crd="httproutes.gateway.networking.k8s.io",
        condition="Routing",
        installer="the Gateway API",
        wanted=wants_http_route,
    ),
    ChildKind(
        PODMONITOR_API_VERSION,
        "PodMonitor",
        "podmonitors",
        crd="podmonitors.monitoring.coreos.com",
        condition="Monitoring",
        installer="the Prometheus Operator's CRDs",
        wanted=wants_pod_monitor,
    ),
    ChildKind(
        HPA_API_VERSION,
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        condition="Autoscaling",
        wanted=wants_hpa,
        deleted_before_writes=True,
    ),
    ChildKind(
        SCALEDOBJECT_API_VERSION,
        "ScaledObject",
        "scaledobjects",
        crd="scaledobjects.keda.sh",
        condition="Autoscaling",
        installer="KEDA",
        wanted=wants_scaled_object,
        deleted_before_writes=True,
    ),
)
CHILD_KIND = {k.kind: k for k in CHILD_KINDS}
WATCHED_KINDS = tuple(k for k in CHILD_KINDS if k.watched)
OPTIONAL_APIS = {(k.api_version, k.kind): k.crd for k in CHILD_KINDS if k.crd}


def owned_kinds_document() -> dict[str, Any]:
    """The owned kinds as the chart's RBAC and admission policies read them (charts/cpullm-operator/files/
    owned-kinds.json is this, printed by `cpullm chart-kinds`; a test keeps it current): the verbs the operator
    needs of each, whether others' writes to it are refused (the built-in kinds: the optional ones' own controllers
    write theirs), and whether it holds a pod template."""
    return {
        "kinds": [
            {
                "group": kind.group,
                "resource": kind.plural,
                "verbs": list(kind.verbs),
                "guarded": kind.crd is None,
                "podTemplate": kind.pod_template,
            }
            for kind in CHILD_KINDS
        ]
    }


def build_children(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> list[dict[str, Any]]:
    """Every owned child the spec asks for, in apply order (CHILDREN): what the pods mount, and every name a
    conflict can stop, before the servers; the servers before the router that sends them requests."""
    return [child for build in CHILDREN if (child := build(owner, spec, plan)) is not None]


def child_ref(child: Mapping[str, Any], owner: Owner) -> str:
    """How status.children names a child: its kind, and its name when it is not the service's."""
    kind, name = child["kind"], child["metadata"]["name"]
    return kind if name == owner.name else f"{kind}/{name}"


def kept_refs(owner: Owner) -> frozenset[str]:
    """The children that live as long as the service, never in status.optionalChildren: the servers' Deployment,
    the Service, and the launcher's ConfigMap (the old pods mount it while a rollout replaces them)."""
    return frozenset({"Deployment", "Service", f"ConfigMap/{launcher_config_map_name(owner)}"})


def child_of_ref(ref: str, owner: Owner) -> dict[str, str] | None:
    """The object a status.children entry names, as a delete needs it; None for a kind no longer owned."""
    kind, _, name = ref.partition("/")
    if kind not in CHILD_KIND:
        return None
    return {
        "apiVersion": CHILD_KIND[kind].api_version,
        "kind": kind,
        "name": name or owner.name,
        "namespace": owner.namespace,
    }


def marker(stored: Mapping[str, Any]) -> str:
    """What changes when another writer changes a stored child: its UID (deleted and made again) and its
    generation (its spec), or its resourceVersion for the kinds without a generation (ConfigMap, Service)."""
    meta = stored.get("metadata") or {}
    return f"{meta.get('uid')}/{meta.get('generation') or meta.get('resourceVersion')}"


def crd_established(status: Mapping[str, Any]) -> bool:
    """Whether the API server serves a CRD's kind (its status): before that an apply answers 404."""
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in status.get("conditions") or [])
