"""The Service in front of a CpuLLMService's vLLM pods."""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.children.common import PORT_NAME, Owner, metadata, selector


def build_service(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any]:
    del plan  # the Service depends on the spec alone; it keeps the builders' one signature
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner),
        "spec": {
            "type": spec.service.type,
            "selector": selector(owner),
            "ports": [{"name": PORT_NAME, "port": spec.service.port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }
