"""The objects the operator owns per CpuLLMService, each built by one pure function in its own module.

A new owned child is a new module here with a `build_*` function added to CHILDREN; then its kind goes into
`io/kube.py`'s apply table, its RBAC into the chart, and its watch into `controller/handlers.py`.
"""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.children.common import ChildBuilder, Owner
from cpullm.core.children.deployment import build_deployment
from cpullm.core.children.launcher import build_launcher_config_map
from cpullm.core.children.service import build_service

CHILDREN: tuple[ChildBuilder, ...] = (build_launcher_config_map, build_deployment, build_service)


def build_children(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> list[dict[str, Any]]:
    """Every owned child, in apply order: what the pods mount exists before the pods are asked for."""
    return [build(owner, spec, plan) for build in CHILDREN]
