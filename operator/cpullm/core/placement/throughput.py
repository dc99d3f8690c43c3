"""Throughput placement: one TP=1 server per NUMA node, each pod sized to one NUMA node's CPUs and memory,
behind a router (or the one Service). For a model that fits one NUMA node this serves more requests than TP across
nodes (no cross-NUMA traffic, no rank synchronisation); vLLM's own data parallelism binds every engine to
the same cores (vLLM issue 47328), so the operator places separate servers instead."""

from __future__ import annotations

from dataclasses import dataclass

from cpullm.api.spec import CpuLLMServiceSpec, RoutingMode
from cpullm.core.placement.base import PodLayout, Shape
from cpullm.core.sizing import ModelSize
from cpullm.core.topology import NUMA_ALIGNING_POLICIES
from cpullm.errors import InvalidPlacement, InvalidTensorParallelSize, ModelTooLarge


@dataclass(frozen=True)
class Throughput:
    name: str = "throughput"

    def layout(self, spec: CpuLLMServiceSpec, model: ModelSize, shape: Shape, explicit_tp: int | None) -> PodLayout:
        if explicit_tp not in (None, 1):
            raise InvalidTensorParallelSize(
                f"throughput placement runs one TP=1 server per NUMA node, but tensor parallel size is {explicit_tp}"
            )
        node = shape.node
        numa_cpus = node.cpus_per_numa_node
        if numa_cpus < 1:
            raise ModelTooLarge(f"{shape.describe()} have fewer CPUs than NUMA nodes: no NUMA node holds a server")
        cpus_per_rank = spec.cpu.cpus_per_rank or numa_cpus
        if cpus_per_rank > numa_cpus:
            raise InvalidPlacement(
                f"throughput placement sizes each server to one NUMA node ({numa_cpus} CPUs on {shape.describe()}), "
                f"but cpu.cpusPerRank is {cpus_per_rank}: lower it, or use placement tensorParallel"
            )
        numa_memory = shape.numa_memory_bytes
        return PodLayout(
            tensor_parallel_size=1,
            cpus_per_rank=cpus_per_rank,
            pod_memory_bytes=numa_memory,
            numa_memory_bytes=numa_memory,
            ranks_per_numa=1,
            pods_per_node=node.numa_nodes,
            why=f"one TP=1 server per NUMA node, {node.numa_nodes} per node",
        )

    def replicas(self, requested: int, capacity: int) -> int:
        return min(requested, capacity)  # a server per NUMA node: no more than there are

    def default_routing(self, spec: CpuLLMServiceSpec) -> RoutingMode:
        """Servers a NUMA node each answer in seconds to minutes and hold few requests at once: spread by
        kube-proxy at random per connection, a burst queues on some while others idle (docs/routing.md)."""
        return RoutingMode.ROUTER if spec.most_replicas > 1 else RoutingMode.SERVICE

    def notes(self, shape: Shape, requested: int, capacity: int) -> list[str]:
        notes = []
        if requested > capacity:
            notes.append(f"replicas capped: {requested} requested, {capacity} NUMA nodes on the chosen nodes")
        node = shape.node
        if node.numa_nodes > 1 and node.topology_manager_policy not in NUMA_ALIGNING_POLICIES:
            notes.append(
                "NUMA alignment best-effort: the nodes' topology manager policy (label cpullm.io/topology-manager-"
                "policy, or their NodeResourceTopology) is not single-numa-node or restricted, so a pod's CPUs may "
                "span NUMA nodes (the launcher binds within them)"
            )
        return notes
