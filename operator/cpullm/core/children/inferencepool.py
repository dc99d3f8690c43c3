"""The InferencePool (Gateway API Inference Extension, inference.networking.k8s.io/v1) selecting a service's
servers, for spec.routing mode inferencePool: a Gateway's endpoint picker then sends each request to the server
its scorers choose from vLLM's own metrics (queue length, KV cache usage). With spec.routing.inferencePool.gateway,
an HTTPRoute (gateway.networking.k8s.io/v1) attaches the pool to that Gateway."""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec, RoutingMode
from cpullm.core.children.common import Owner, metadata, selector

INFERENCEPOOL_API_VERSION = "inference.networking.k8s.io/v1"
HTTPROUTE_API_VERSION = "gateway.networking.k8s.io/v1"


def wants_inference_pool(spec: CpuLLMServiceSpec, plan: Plan) -> bool:
    return plan.routing == RoutingMode.INFERENCE_POOL and spec.routing.inference_pool is not None


def wants_http_route(spec: CpuLLMServiceSpec, plan: Plan) -> bool:
    pool = spec.routing.inference_pool
    return wants_inference_pool(spec, plan) and pool is not None and pool.gateway is not None


def build_inference_pool(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    pool = spec.routing.inference_pool
    if not wants_inference_pool(spec, plan) or pool is None:
        return None
    return {
        "apiVersion": INFERENCEPOOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": metadata(owner),
        "spec": {
            "selector": {"matchLabels": selector(owner)},
            "targetPorts": [{"number": spec.service.port}],
            "endpointPickerRef": {"name": pool.endpoint_picker, "port": {"number": pool.endpoint_picker_port}},
        },
    }


def build_http_route(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    pool = spec.routing.inference_pool
    if not wants_http_route(spec, plan) or pool is None or pool.gateway is None:
        return None
    group = INFERENCEPOOL_API_VERSION.partition("/")[0]
    return {
        "apiVersion": HTTPROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": metadata(owner),
        "spec": {
            "parentRefs": [{"name": pool.gateway}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [{"group": group, "kind": "InferencePool", "name": owner.name}],
                }
            ],
        },
    }
