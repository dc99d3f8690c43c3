"""The autoscaler of a CpuLLMService, when spec.autoscaling asks for one: a HorizontalPodAutoscaler or a KEDA
ScaledObject, both targeting the CpuLLMService's own scale subresource. The operator stays the one writer of
the Deployment, and the plan caps what can be placed (status.plan.replicas, placementNote).

The signal is vLLM's queue (`vllm:num_requests_waiting` per replica), not CPU: a busy CPU server is always at
100%. An optional guard scales up on KV cache usage too. Scale-down is stabilised for CPU cold starts.
"""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import API_VERSION, KIND, AutoscalerKind, CpuLLMServiceSpec
from cpullm.core.children.common import Owner, metadata
from cpullm.core.children.podmonitor import SERVICE_METRIC_LABEL

# The custom metrics API cannot serve names with ':'; a prometheus-adapter rule exposes vLLM's gauges as these
# (README, "Autoscaling").
HPA_WAITING_METRIC = "vllm_num_requests_waiting"
HPA_KV_USAGE_METRIC = "vllm_kv_cache_usage_perc"
HPA_API_VERSION = "autoscaling/v2"
SCALEDOBJECT_API_VERSION = "keda.sh/v1alpha1"


def _target(owner: Owner) -> dict[str, str]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": owner.name}


def _scale_down(seconds: int) -> dict[str, Any]:
    return {"scaleDown": {"stabilizationWindowSeconds": seconds}}


def wants_scaled_object(spec: CpuLLMServiceSpec, plan: Plan) -> bool:
    del plan  # the plan caps what is placed; the autoscaler asks for what the load needs
    return spec.autoscaling is not None and spec.autoscaling.kind == AutoscalerKind.KEDA


def wants_hpa(spec: CpuLLMServiceSpec, plan: Plan) -> bool:
    return spec.autoscaling is not None and not wants_scaled_object(spec, plan)


def build_autoscaler(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    scaling = spec.autoscaling
    if scaling is None:
        return None
    if wants_scaled_object(spec, plan):
        return _scaled_object(owner, spec)
    metrics: list[dict[str, Any]] = [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": HPA_WAITING_METRIC},
                "target": {"type": "AverageValue", "averageValue": str(scaling.target_waiting_requests)},
            },
        }
    ]
    if scaling.max_kv_cache_usage is not None:
        metrics.append(
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": HPA_KV_USAGE_METRIC},
                    "target": {"type": "AverageValue", "averageValue": f"{int(scaling.max_kv_cache_usage * 1000)}m"},
                },
            }
        )
    return {
        "apiVersion": HPA_API_VERSION,
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(owner),
        "spec": {
            "scaleTargetRef": _target(owner),
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": metrics,
            "behavior": _scale_down(scaling.scale_down_stabilization_seconds),
        },
    }


def _scaled_object(owner: Owner, spec: CpuLLMServiceSpec) -> dict[str, Any]:
    scaling = spec.autoscaling
    assert scaling is not None and scaling.prometheus_address is not None  # spec validation
    series = f'{{namespace="{owner.namespace}",{SERVICE_METRIC_LABEL}="{owner.name}"}}'
    triggers: list[dict[str, Any]] = [
        {
            "type": "prometheus",
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": scaling.prometheus_address,
                "query": f"sum(vllm:num_requests_waiting{series})",
                "threshold": str(scaling.target_waiting_requests),
            },
        }
    ]
    if scaling.max_kv_cache_usage is not None:
        triggers.append(
            {
                "type": "prometheus",
                "metricType": "Value",
                "metadata": {
                    "serverAddress": scaling.prometheus_address,
                    "query": f"avg(vllm:kv_cache_usage_perc{series})",
                    "threshold": str(scaling.max_kv_cache_usage),
                },
            }
        )
    return {
        "apiVersion": SCALEDOBJECT_API_VERSION,
        "kind": "ScaledObject",
        "metadata": metadata(owner),
        "spec": {
            "scaleTargetRef": _target(owner),
            "minReplicaCount": scaling.min_replicas,
            "maxReplicaCount": scaling.max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {"behavior": _scale_down(scaling.scale_down_stabilization_seconds)}
            },
            "triggers": triggers,
        },
    }
