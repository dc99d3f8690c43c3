"""How requests reach a service's servers (spec.routing), and the drain that lets a server stop without cutting
what it holds. Pure: the planner resolves both into the plan, the children builders render them."""

from __future__ import annotations

import math

from cpullm.api.spec import CpuLLMServiceSpec, RoutingMode
from cpullm.core import constants as c
from cpullm.core.placement import PlacementStrategy, Shape
from cpullm.core.topology import parse_quantity

# How the plan's note names the room left for the router.
ROUTER_TAKER = "the router"


def routing_mode(spec: CpuLLMServiceSpec, strategy: PlacementStrategy) -> RoutingMode:
    """The spec's mode, or the placement's default for auto."""
    mode = spec.routing.mode
    return strategy.default_routing(spec) if mode == RoutingMode.AUTO else mode


def leave_router_room(spec: CpuLLMServiceSpec, shape: Shape) -> tuple[Shape, int]:
    """The shape with room left on each node for one router pod, and the CPU (millis) the router then requests.

    Its memory is always left. Its CPU request only where the nodes have it to spare: 100m beside whole-CPU
    servers on a node of 64 allocatable CPUs would cost a whole CPU of each node (of each NUMA node, with
    throughput placement); there the router requests no CPU and runs on what the shared pool leaves (the CPU
    manager's exclusive CPUs are never in it)."""
    router = spec.routing.router
    cpu, memory = math.ceil(parse_quantity(router.cpu) * 1000), math.ceil(parse_quantity(router.memory))
    if shape.leaving(ROUTER_TAKER, cpu, memory).node.cpus == shape.node.cpus:
        return shape.leaving(ROUTER_TAKER, cpu, memory), cpu
    taker = f"the router's memory (it requests no CPU: {router.cpu} would cost each node a whole CPU)"
    return shape.leaving(taker, 0, memory), 0


def drain_seconds(spec: CpuLLMServiceSpec, max_model_len: int | None, weight_shard_bytes: int) -> int:
    """The longest a request may run: the spec's, else the context decoded token by token at a pessimistic
    weight-streaming rate, within [DRAIN_MIN_SECONDS, DRAIN_MAX_SECONDS] (no context length: the maximum)."""
    if spec.routing.drain_seconds is not None:
        return spec.routing.drain_seconds
    if max_model_len is None:
        return c.DRAIN_MAX_SECONDS
    decode = math.ceil(max_model_len * weight_shard_bytes / c.DRAIN_DECODE_BYTES_PER_SECOND)
    return min(c.DRAIN_MAX_SECONDS, max(c.DRAIN_MIN_SECONDS, decode))
