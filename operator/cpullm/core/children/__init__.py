"""The objects the operator owns per CpuLLMService, each built by one pure function in its own module.

A new owned child is a new module here with a `build_*` function added to CHILDREN and its kind's line in
CHILD_KINDS; what the rest of the operator needs of a kind (the API calls, the watches and their resync, the
optional APIs' conditions, what a spec can stop asking for) derives from that line. Its RBAC goes into the chart
(`tests/unit/test_rbac.py` checks that the chart grants what CHILD_KINDS needs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.children.autoscaler import HPA_API_VERSION, SCALEDOBJECT_API_VERSION, build_autoscaler
from cpullm.core.children.common import ChildBuilder, Owner
from cpullm.core.children.deployment import build_deployment
from cpullm.core.children.launcher import build_launcher_config_map
from cpullm.core.children.podmonitor import PODMONITOR_API_VERSION, build_pod_monitor
from cpullm.core.children.service import build_service

CHILDREN: tuple[ChildBuilder, ...] = (
    build_launcher_config_map,
    build_deployment,
    build_service,
    build_pod_monitor,
    build_autoscaler,
)


@dataclass(frozen=True)
class ChildKind:
    """An owned kind, and how the operator handles it."""

    api_version: str
    kind: str
    plural: str
    # Watched (drift reverted, readiness copied) and listed by the resync: the children every service has.
    watched: bool = False
    # Deleted when the spec stops asking for it (the others live as long as the service).
    removable: bool = False
    # The CRD that serves it, when its API is not built into Kubernetes: applied only where it is installed,
    # elsewhere a condition says what to install.
    crd: str | None = None

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def verbs(self) -> tuple[str, ...]:
        """What the operator does with it: server-side apply (create + patch), a read before an apply or delete,
        and a watch and metadata list (watched) or a delete (removable)."""
        return ("get", "create", "patch", *(("list", "watch") if self.watched else ()), *(("delete",) * self.removable))


CHILD_KINDS: tuple[ChildKind, ...] = (
    ChildKind("v1", "ConfigMap", "configmaps", watched=True),
    ChildKind("apps/v1", "Deployment", "deployments", watched=True),
    ChildKind("v1", "Service", "services", watched=True),
    ChildKind(
        PODMONITOR_API_VERSION, "PodMonitor", "podmonitors", removable=True, crd="podmonitors.monitoring.coreos.com"
    ),
    ChildKind(HPA_API_VERSION, "HorizontalPodAutoscaler", "horizontalpodautoscalers", removable=True),
    ChildKind(SCALEDOBJECT_API_VERSION, "ScaledObject", "scaledobjects", removable=True, crd="scaledobjects.keda.sh"),
)
CHILD_KIND = {k.kind: k for k in CHILD_KINDS}
WATCHED_KINDS = tuple(k for k in CHILD_KINDS if k.watched)
OPTIONAL_APIS = {(k.api_version, k.kind): k.crd for k in CHILD_KINDS if k.crd}
REMOVABLE_KINDS = {k.kind: k.api_version for k in CHILD_KINDS if k.removable}


def build_children(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> list[dict[str, Any]]:
    """Every owned child the spec asks for, in apply order: what the pods mount exists before the pods."""
    return [child for build in CHILDREN if (child := build(owner, spec, plan)) is not None]
