"""What every placement strategy shares: a shape of nodes, the layout a strategy gives one pod on it, and
what vLLM's CPU backend allows for tensor parallelism."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cpullm.api.plan import NodeShape
from cpullm.api.spec import CpuLLMServiceSpec, RoutingMode
from cpullm.core.daemonsets import NO_ROOM, DaemonPods, Room, rooms_on
from cpullm.core.memo import cached
from cpullm.core.performance import NodePerformance, estimated_performance
from cpullm.core.sizing import ModelSize
from cpullm.core.topology import NodeProfile
from cpullm.errors import name_list


@dataclass(frozen=True)
class Shape:
    """Eligible nodes that get the same plan (NodeProfile.shape, and the same room left for DaemonSets on them);
    planned with the least memory among them, less that room."""

    members: tuple[NodeProfile, ...]
    room: Room = NO_ROOM

    @cached
    def node(self) -> NodeProfile:
        """The first member, with the room left for DaemonSets taken out of its CPUs (whole ones) and memory."""
        first, room = self.members[0], self.room
        if room == NO_ROOM:
            return first
        memory = max(0, first.memory_bytes - room.memory_bytes)
        return dataclasses.replace(first, cpus=room.cpus_left(first), memory_bytes=memory)

    @property
    def memory_bytes(self) -> int:
        return max(0, min(n.memory_bytes for n in self.members) - self.room.memory_bytes)

    @cached
    def performance(self) -> NodePerformance:
        """What its cores do: the slowest probe among its members', else an estimate by their ISA class."""
        measured = [n.performance for n in self.members if n.performance is not None]
        if measured:
            return min(measured, key=lambda p: p.slowest().every.read)
        node = self.node
        return estimated_performance(node.name, node.arch, node.isa, node.numa_nodes, node.cpus_per_numa_node)

    @property
    def price_per_hour(self) -> float | None:
        """What an hour of one of its nodes costs: the dearest labelled member's (None: none is labelled)."""
        prices = [n.price_per_hour for n in self.members if n.price_per_hour is not None]
        return max(prices) if prices else None

    @property
    def numa_memory_bytes(self) -> int:
        """One NUMA node's memory: an even share of the shape's, or less where a member reports less for its
        smallest NUMA node (core/node_topology.py)."""
        even = self.memory_bytes // self.node.numa_nodes
        reported = [min(n.numa_memory_bytes) for n in self.members if n.numa_memory_bytes]
        return min(even, *reported) if reported else even

    def leaving(self, taker: str, cpu_millis: int, memory_bytes: int) -> Shape:
        """The same nodes, each leaving room for one more pod of these requests (the router's)."""
        return Shape(self.members, self.room.plus(taker, cpu_millis, memory_bytes))

    @property
    def names(self) -> list[str]:
        return sorted(n.name for n in self.members)

    def describe(self) -> str:
        node = self.node
        return f"{node.arch}/{node.numa_nodes}-NUMA/{node.cpus}-CPU nodes ({name_list(self.names)})"


@dataclass(frozen=True)
class PodLayout:
    """How one pod sits on a node of the shape, as a strategy decided it."""

    tensor_parallel_size: int
    cpus_per_rank: int
    pod_memory_bytes: int  # what one pod may use: a whole node's memory, or one NUMA node's
    numa_memory_bytes: int  # one NUMA node's memory: each rank's part must fit in it
    ranks_per_numa: int
    pods_per_node: int
    why: str  # the TP and placement choice in words, for the plan's summary


class PlacementStrategy(Protocol):
    """Lays one pod out on a shape of nodes (TP, CPUs, the memory it may use); sizing, binding and the
    children are the same for every strategy. Raises a PlanRefusal when the shape cannot hold the pod."""

    @property
    def name(self) -> str: ...

    def layout(self, spec: CpuLLMServiceSpec, model: ModelSize, shape: Shape, explicit_tp: int | None) -> PodLayout: ...

    def replicas(self, requested: int, capacity: int) -> int:
        """How many pods to run of the `requested`, when the chosen nodes hold `capacity`."""
        ...

    def notes(self, shape: Shape, requested: int, capacity: int) -> list[str]:
        """What this placement could not do or needs, for the plan's placementNote."""
        ...

    def default_routing(self, spec: CpuLLMServiceSpec) -> RoutingMode:
        """How requests reach this placement's servers when spec.routing.mode is auto."""
        ...


def largest_valid_tensor_parallel_size(at_most: int, model: ModelSize) -> int:
    return next(t for t in range(at_most, 0, -1) if model.tensor_parallel_problem(t) is None)


def shapes_of(nodes: Sequence[NodeProfile], daemons: Sequence[DaemonPods] = ()) -> list[Shape]:
    """The nodes grouped by shape and by the room their DaemonSets take (with the CPUs that room leaves whole:
    64.5 and 64 allocatable CPUs are one shape, but not less 100m). Building a NodeProfile per node was 2/3 of a
    5,000-node plan beside four DaemonSets; a shape's node is made once."""
    if not daemons:
        plain: dict[NodeShape, list[NodeProfile]] = {}
        for node in nodes:
            plain.setdefault(node.shape, []).append(node)
        return [Shape(tuple(members)) for members in plain.values()]
    groups: dict[tuple[NodeShape, Room, int], list[NodeProfile]] = {}
    for node, room in zip(nodes, rooms_on(nodes, daemons), strict=True):
        groups.setdefault((node.shape, room, room.cpus_left(node)), []).append(node)
    return [Shape(tuple(members), room) for (_, room, _), members in groups.items()]
