"""Placement strategies: how a service's pods sit on a shape of nodes. Each is one module implementing
PlacementStrategy (base.py); a new one is a new module and an entry in STRATEGIES.

`spec.placement: auto` picks per shape by model size: throughput when one TP=1 server (its weights, KV cache
and runtime, with the server processes and /dev/shm) fits one NUMA node's memory, else tensorParallel; an
explicit TP above 1 (tensorParallelSize or a multi-rank bind list) is tensorParallel.
"""

from __future__ import annotations

from cpullm.api.spec import CpuLLMServiceSpec, Placement
from cpullm.core.placement.base import PlacementStrategy, PodLayout, Shape
from cpullm.core.placement.tensor_parallel import TensorParallel
from cpullm.core.placement.throughput import Throughput

STRATEGIES: dict[Placement, PlacementStrategy] = {
    Placement.TENSOR_PARALLEL: TensorParallel(),
    Placement.THROUGHPUT: Throughput(),
}

__all__ = ["STRATEGIES", "PlacementStrategy", "PodLayout", "Shape", "strategy_for"]


def strategy_for(
    spec: CpuLLMServiceSpec, one_server_fits_a_numa_node: bool, explicit_tp: int | None
) -> PlacementStrategy:
    if spec.placement == Placement.AUTO:
        throughput = one_server_fits_a_numa_node and explicit_tp in (None, 1)
        return STRATEGIES[Placement.THROUGHPUT if throughput else Placement.TENSOR_PARALLEL]
    return STRATEGIES[spec.placement]
