"""Tensor-parallel placement (the default): one pod per node, one rank per NUMA node, so a model too big for
one NUMA node's memory or bandwidth is served by all of the node's memory and cores."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cpullm.api.spec import CpuLLMServiceSpec, RoutingMode, ThreadsBindMode
from cpullm.core.placement.base import PodLayout, Shape, largest_valid_tensor_parallel_size
from cpullm.core.sizing import ModelSize
from cpullm.errors import InvalidTensorParallelSize, ModelTooLarge


@dataclass(frozen=True)
class TensorParallel:
    name: str = "tensorParallel"

    def layout(self, spec: CpuLLMServiceSpec, model: ModelSize, shape: Shape, explicit_tp: int | None) -> PodLayout:
        node = shape.node
        tp = explicit_tp if explicit_tp is not None else largest_valid_tensor_parallel_size(node.numa_nodes, model)
        if tp > node.numa_nodes and spec.cpu.threads_bind == ThreadsBindMode.AUTO and node.cpu_manager_policy != "none":
            fits = largest_valid_tensor_parallel_size(node.numa_nodes, model)
            raise InvalidTensorParallelSize(
                f"tensor parallel size {tp} exceeds the {node.numa_nodes} NUMA nodes of {shape.describe()}; vLLM's "
                f"'auto' binding needs one NUMA node per rank: leave tensorParallelSize unset (TP {fits} there), or "
                "bind ranks yourself (cpu.threadsBind: an explicit list, or nobind, which pins nothing)"
            )
        # One rank per NUMA node takes what the smallest NUMA node has; more ranks than NUMA nodes share the node.
        cpus_per_rank = spec.cpu.cpus_per_rank or (
            node.cpus_per_numa_node if tp <= node.numa_nodes else node.cpus // tp
        )
        if cpus_per_rank < 1 or cpus_per_rank * tp > node.cpus:
            raise ModelTooLarge(
                f"{tp} ranks of {max(cpus_per_rank, 1)} CPUs do not fit the {node.cpus} CPUs of {shape.describe()}; "
                "set a smaller cpu.cpusPerRank or tensorParallelSize, or choose nodes with more CPUs"
            )
        why = "explicit" if explicit_tp is not None else f"one rank per NUMA node of {node.numa_nodes}"
        return PodLayout(
            tensor_parallel_size=tp,
            cpus_per_rank=cpus_per_rank,
            pod_memory_bytes=shape.memory_bytes,
            numa_memory_bytes=shape.numa_memory_bytes,
            ranks_per_numa=math.ceil(tp / node.numa_nodes),
            pods_per_node=1,
            why=why,
        )

    def replicas(self, requested: int, capacity: int) -> int:
        return requested  # one pod per node: more than the nodes hold wait Pending, as any Deployment's would

    def notes(self, shape: Shape, requested: int, capacity: int) -> list[str]:
        if requested <= capacity:
            return []
        waiting = requested - capacity
        return [
            f"{requested} replicas asked, the chosen nodes hold {capacity}: {waiting} stay Pending until nodes like "
            "them join (or free up)"
        ]

    def default_routing(self, spec: CpuLLMServiceSpec) -> RoutingMode:
        del spec  # one large server per node: the Service spreads them well enough
        return RoutingMode.SERVICE
