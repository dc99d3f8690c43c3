"""The PodMonitor (Prometheus Operator) scraping a CpuLLMService's vLLM pods, when spec.monitoring asks for it.

vLLM serves Prometheus metrics at /metrics on its API port. The PodMonitor adds the label `cpullm_service` (the
service's name) to every series, so queries and autoscaler triggers can select one service's servers; where
spec.apiKeySecret.metrics is key, it sends the API key from the service's Secret.
"""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.children.common import PORT_NAME, SERVICE_LABEL, Owner, metadata, selector

PODMONITOR_API_VERSION = "monitoring.coreos.com/v1"
SERVICE_METRIC_LABEL = "cpullm_service"


def wants_pod_monitor(spec: CpuLLMServiceSpec, plan: Plan) -> bool:
    del plan  # what is scraped does not depend on the plan
    return spec.monitoring.pod_monitor


def build_pod_monitor(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    if not wants_pod_monitor(spec, plan):
        return None
    pod_label = "__meta_kubernetes_pod_label_" + "".join(ch if ch.isalnum() else "_" for ch in SERVICE_LABEL)
    endpoint: dict[str, Any] = {
        "port": PORT_NAME,
        "path": "/metrics",
        "interval": spec.monitoring.interval,
        "relabelings": [{"sourceLabels": [pod_label], "targetLabel": SERVICE_METRIC_LABEL}],
    }
    if spec.metrics_need_key and spec.api_key_secret:  # Prometheus reads the Secret in this namespace
        key = spec.api_key_secret
        endpoint["authorization"] = {"type": "Bearer", "credentials": {"name": key.name, "key": key.key}}
    return {
        "apiVersion": PODMONITOR_API_VERSION,
        "kind": "PodMonitor",
        "metadata": metadata(owner),
        "spec": {
            "selector": {"matchLabels": selector(owner)},
            "podMetricsEndpoints": [endpoint],
        },
    }
