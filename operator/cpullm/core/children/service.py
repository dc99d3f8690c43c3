"""The Service in front of a CpuLLMService: its one address. It selects the servers, or the router's pods when the
plan routes through one (core/children/router.py)."""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.children.common import PORT_NAME, Owner, metadata, selector
from cpullm.core.children.router import router_selector, uses_router


def build_service(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner),
        "spec": {
            "type": spec.service.type,
            "selector": router_selector(owner) if uses_router(plan) else selector(owner),
            "ports": [{"name": PORT_NAME, "port": spec.service.port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }
