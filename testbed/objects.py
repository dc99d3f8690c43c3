"""The objects the e2e suite and the scale bench make: the sample nodes, KWOK nodes shaped for one test, and a
small CpuLLMService."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from testbed.cluster import FAKE_NODE_ANNOTATION
from testbed.tools import ROOT

E2E_LABEL = "cpullm.io/e2e"
SAMPLE_NODES = ROOT / "examples" / "nodes.yaml"
QWEN_SMALL = yaml.safe_load((ROOT / "manifests" / "examples" / "qwen-small.yaml").read_text())


def sample_nodes() -> list[dict[str, Any]]:
    """The sample nodes, labelled so the suite's services select only them (on kind, real workers exist), and
    annotated as KWOK's fake nodes (a cluster with a real node has KWOK manage only those)."""
    nodes = yaml.safe_load(SAMPLE_NODES.read_text())["items"]
    key, value = FAKE_NODE_ANNOTATION
    for node in nodes:
        node["metadata"]["labels"][E2E_LABEL] = "true"
        node["metadata"].setdefault("annotations", {})[key] = value
    return nodes


def fake_node(
    name: str, *, numa: int = 2, cpu: str = "32", memory: str = "128Gi", disk: str = "900Gi", **labels: str
) -> dict[str, Any]:
    """A KWOK node shaped for one test (AMX Xeon by default), annotated kwok.x-k8s.io/node=fake (from
    sample_nodes()); `disk` is its ephemeral storage."""
    node = copy.deepcopy(sample_nodes()[0])
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, "cpullm.io/numa-nodes": str(numa), **labels})
    for amounts in (node["status"]["capacity"], node["status"]["allocatable"]):
        amounts.update({"cpu": cpu, "memory": memory, "ephemeral-storage": disk})
    return node


def tiny_service(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """Qwen2.5-0.5B with 2 CPUs per rank: many fit on one node, so tests do not compete for capacity."""
    body: dict[str, Any] = {
        "model": copy.deepcopy(QWEN_SMALL["spec"]["model"]),
        "kvCacheGiB": 1,
        "maxModelLen": 4096,
        "cpu": {"cpusPerRank": 2},
        "nodeSelector": {E2E_LABEL: "true"},
    }
    body.update(spec)
    body = {key: value for key, value in body.items() if value is not None}  # None: leave the field out
    return {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def topology_object(
    name: str = "node-0",
    *,
    cpus: tuple[int, ...] = (32, 32),
    memory_gib: tuple[int, ...] | None = None,
    policy: str | None = None,
) -> dict[str, Any]:
    """A NodeResourceTopology as NFD's topology-updater publishes it: one zone of type Node per NUMA node with
    allocatable CPUs and memory (whole CPUs; bytes), the kubelet's topology manager policy as an attribute."""
    memory = memory_gib or tuple(128 for _ in cpus)
    zones = [
        {
            "name": f"node-{i}",
            "type": "Node",
            "costs": [{"name": f"node-{j}", "value": 10 if i == j else 21} for j in range(len(cpus))],
            "resources": [
                {"name": "cpu", "capacity": str(c + 1), "allocatable": str(c), "available": str(c)},
                {"name": "memory", "capacity": str(m * 2**30), "allocatable": str(m * 2**30), "available": "0"},
            ],
        }
        for i, (c, m) in enumerate(zip(cpus, memory, strict=True))
    ]
    attributes = [{"name": "topologyManagerPolicy", "value": policy}] if policy else []
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "zones": zones,
        "attributes": [*attributes, {"name": "topologyManagerScope", "value": "container"}],
    }
