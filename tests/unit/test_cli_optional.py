"""`cpullm render` of a service that asks for monitoring and autoscaling: offline the installed CRDs are
unknown, so every optional child the spec asks for is printed, after the core children, without owners."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cpullm.cli import main

ROOT = Path(__file__).resolve().parents[2]
NODES = str(ROOT / "examples" / "nodes.yaml")
EXAMPLE = ROOT / "manifests" / "examples" / "llama-8b-amx.yaml"
PROMETHEUS = "http://prometheus.monitoring:9090"
LABELS = {
    "app.kubernetes.io/name": "vllm",
    "app.kubernetes.io/instance": "llama-8b",
    "app.kubernetes.io/managed-by": "cpullm-operator",
    "cpullm.io/service": "llama-8b",
}
METADATA = {"name": "llama-8b", "namespace": "default", "labels": LABELS}
TARGET = {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService", "name": "llama-8b"}
POD_MONITOR = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PodMonitor",
    "metadata": METADATA,
    "spec": {
        "selector": {"matchLabels": {"cpullm.io/service": "llama-8b"}},
        "podMetricsEndpoints": [
            {
                "port": "http",
                "path": "/metrics",
                "interval": "15s",
                "relabelings": [
                    {"sourceLabels": ["__meta_kubernetes_pod_label_cpullm_io_service"], "targetLabel": "cpullm_service"}
                ],
            }
        ],
    },
}
HPA = {
    "apiVersion": "autoscaling/v2",
    "kind": "HorizontalPodAutoscaler",
    "metadata": METADATA,
    "spec": {
        "scaleTargetRef": TARGET,
        "minReplicas": 1,
        "maxReplicas": 3,
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "vllm_num_requests_waiting"},
                    "target": {"type": "AverageValue", "averageValue": "3"},
                },
            },
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "vllm_kv_cache_usage_perc"},
                    "target": {"type": "AverageValue", "averageValue": "900m"},
                },
            },
        ],
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
    },
}
# A service an autoscaler may scale past one server: its servers get a PodDisruptionBudget.
PDB = {
    "apiVersion": "policy/v1",
    "kind": "PodDisruptionBudget",
    "metadata": METADATA,
    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"cpullm.io/service": "llama-8b"}}},
}
SCALED_OBJECT = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": METADATA,
    "spec": {
        "scaleTargetRef": TARGET,
        "minReplicaCount": 0,
        "maxReplicaCount": 2,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 900}}}},
        "triggers": [
            {
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": PROMETHEUS,
                    "query": 'sum(vllm:num_requests_waiting{namespace="default",cpullm_service="llama-8b"})',
                    "threshold": "2",
                },
            }
        ],
    },
}
HPA_SCALING = {
    "maxReplicas": 3,
    "targetWaitingRequests": 3,
    "maxKvCacheUsage": 0.9,
    "scaleDownStabilizationSeconds": 600,
}
KEDA_SCALING = {"kind": "keda", "minReplicas": 0, "maxReplicas": 2, "prometheusAddress": PROMETHEUS}


def write_service(tmp_path: Path, **fields: object) -> str:
    service = yaml.safe_load(EXAMPLE.read_text())
    service["spec"].update(fields)
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump(service))
    return str(path)


@pytest.mark.parametrize(
    ("fields", "kinds", "optional"),
    [
        pytest.param(
            {"monitoring": {"podMonitor": True, "interval": "15s"}, "autoscaling": HPA_SCALING},
            [
                "NetworkPolicy",
                "ConfigMap",
                "PodDisruptionBudget",
                "Service",
                "Deployment",
                "PodMonitor",
                "HorizontalPodAutoscaler",
            ],
            [PDB, POD_MONITOR, HPA],
            id="podmonitor-and-hpa",
        ),
        pytest.param(
            {"autoscaling": KEDA_SCALING},
            ["NetworkPolicy", "ConfigMap", "PodDisruptionBudget", "Service", "Deployment", "ScaledObject"],
            [PDB, SCALED_OBJECT],
            id="keda-scale-to-zero",
        ),
        pytest.param(
            {}, ["NetworkPolicy", "ConfigMap", "PodDisruptionBudget", "Service", "Deployment"], [PDB], id="neither"
        ),
    ],
)
@pytest.mark.parametrize("output", ["yaml", "json"])
def test_render_prints_the_optional_children_in_apply_order(tmp_path, capsys, fields, kinds, optional, output):
    assert main(["render", write_service(tmp_path, **fields), "--nodes", NODES, "-o", output]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    if output == "json":
        listed = json.loads(captured.out)
        assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
        objects = listed["items"]
    else:
        objects = list(yaml.safe_load_all(captured.out))
    assert [o["kind"] for o in objects] == kinds
    # The NetworkPolicy's own shapes are tests/unit/test_network_policy.py's.
    base = ("NetworkPolicy", "ConfigMap", "Service", "Deployment")
    assert [o for o in objects if o["kind"] not in base] == optional
    assert all("ownerReferences" not in o["metadata"] for o in objects)  # no uid offline: no owner


def test_render_refuses_an_inconsistent_autoscaling_spec(tmp_path, capsys):
    path = write_service(tmp_path, autoscaling={"kind": "keda", "maxReplicas": 2})
    assert main(["render", path, "--nodes", NODES]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "cpullm: InvalidSpec: spec.autoscaling: Value error, kind keda needs prometheusAddress "
        "(KEDA's Prometheus trigger queries it)\n"
    )
