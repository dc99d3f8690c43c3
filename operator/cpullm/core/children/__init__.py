"""The objects the operator owns per CpuLLMService, each built by one pure function in its own module.

A new owned child is a new module here with a `build_*` function added to CHILDREN; then its kind goes into
`io/kube.py`'s apply table, its RBAC into the chart, and its watch into `controller/handlers.py`.
"""

from __future__ import annotations

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

# Children whose API is not built into Kubernetes: (apiVersion, kind) -> the CRD that serves it. The operator
# applies them only where the CRD is installed; elsewhere a condition says what to install.
OPTIONAL_APIS = {
    (PODMONITOR_API_VERSION, "PodMonitor"): "podmonitors.monitoring.coreos.com",
    (SCALEDOBJECT_API_VERSION, "ScaledObject"): "scaledobjects.keda.sh",
}
# Children the operator deletes when the spec stops asking for them (the others live as long as the service).
REMOVABLE_KINDS = {
    "PodMonitor": PODMONITOR_API_VERSION,
    "HorizontalPodAutoscaler": HPA_API_VERSION,
    "ScaledObject": SCALEDOBJECT_API_VERSION,
}


def build_children(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> list[dict[str, Any]]:
    """Every owned child the spec asks for, in apply order: what the pods mount exists before the pods."""
    return [child for build in CHILDREN if (child := build(owner, spec, plan)) is not None]
