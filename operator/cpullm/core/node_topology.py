"""The second node-facts source: NodeResourceTopology objects (`topology.node.k8s.io/v1alpha2`, one per node, named
after it, published by Node Feature Discovery's topology-updater or the scheduler-plugins' exporter). Labels
(core/topology.py) say how many NUMA nodes a node has when someone labelled it; a NodeResourceTopology says what
each NUMA node holds, as the kubelet allocates it: its zones of type `Node`, each with its allocatable CPUs and
memory, and the kubelet's topology manager policy among its attributes.

Where a node has one, it is preferred for the NUMA count, the CPUs and memory of each NUMA node (reserved CPUs
make them uneven: a kubelet reserving CPU 0 leaves NUMA node 0 one CPU short) and the topology manager policy.
Where it has none, or it cannot be read, the labels stand alone: no condition, a warning in the log.

How pods select nodes with these facts: they are no labels, so a pod template cannot name them. The node
selector terms stay those of the labels (core/node_selection.py), and the planner excludes by name the nodes
the labels select whose NodeResourceTopology says the pod cannot fit them (core/planner.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cpullm.core.topology import (
    MAX_NUMA_NODES,
    TOPOLOGY_MANAGER_POLICIES,
    NodeProfile,
    parse_quantity,
)
from cpullm.errors import NodeTopologyError

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
PLURAL = "noderesourcetopologies"
CRD_NAME = f"{PLURAL}.{GROUP}"
KIND = "NodeResourceTopology"
NUMA_SOURCE = KIND  # NodeProfile.numa_source when the NUMA count came from one
NUMA_ZONE_TYPE = "Node"  # a zone that is one NUMA node (the topology-updater's zone type; others are ignored)
POLICY_ATTRIBUTE = "topologyManagerPolicy"


@dataclass(frozen=True)
class NumaZone:
    name: str
    cpus: int  # allocatable, whole CPUs
    memory_bytes: int  # allocatable


@dataclass(frozen=True)
class NodeTopology:
    """What one NodeResourceTopology says of its node."""

    node: str
    zones: tuple[NumaZone, ...]
    topology_manager_policy: str | None


def parse_topology(obj: Mapping[str, Any]) -> NodeTopology:
    """Read one NodeResourceTopology. Raises NodeTopologyError when it cannot be used (no NUMA zone, a zone
    without allocatable CPU or memory, a policy the kubelet does not have)."""
    name = str((obj.get("metadata") or {}).get("name", ""))

    def fail(why: str) -> NodeTopologyError:
        return NodeTopologyError(f"{KIND} {name}: {why}")

    raw_zones = obj.get("zones")
    if not isinstance(raw_zones, list):
        raise fail("zones is not a list")
    zones = []
    for zone in raw_zones:
        if not isinstance(zone, Mapping) or zone.get("type") != NUMA_ZONE_TYPE:
            continue
        zone_name = str(zone.get("name", ""))
        resources = {r.get("name"): r for r in zone.get("resources") or [] if isinstance(r, Mapping)}
        cpu = _allocatable(resources, "cpu", zone_name, fail)
        memory = _allocatable(resources, "memory", zone_name, fail)
        zones.append(NumaZone(zone_name, int(cpu), int(memory)))
    if not zones:
        raise fail(f"no zone of type {NUMA_ZONE_TYPE} (NUMA node)")
    if len(zones) > MAX_NUMA_NODES:
        raise fail(f"{len(zones)} NUMA zones, more than {MAX_NUMA_NODES}")
    attributes = {a.get("name"): a.get("value") for a in obj.get("attributes") or [] if isinstance(a, Mapping)}
    policy = attributes.get(POLICY_ATTRIBUTE)
    if policy is not None and policy not in TOPOLOGY_MANAGER_POLICIES:
        raise fail(f"attribute {POLICY_ATTRIBUTE}={policy!r} is not one of {', '.join(TOPOLOGY_MANAGER_POLICIES)}")
    return NodeTopology(name, tuple(sorted(zones, key=lambda z: z.name)), policy)


def _allocatable(resources: Mapping[Any, Mapping[str, Any]], resource: str, zone: str, fail: Any) -> int:
    entry = resources.get(resource)
    if entry is None:
        raise fail(f"zone {zone} has no {resource}")
    value = entry.get("allocatable")
    try:
        amount = parse_quantity(value if value is not None else "")
    except ValueError as err:
        raise fail(f"zone {zone}: allocatable {resource}: {err}") from None
    if amount < 0:
        raise fail(f"zone {zone}: allocatable {resource} {value!r} is negative")
    return int(amount)  # whole CPUs (the kubelet allocates exclusive CPUs whole), bytes


def with_topology(profile: NodeProfile, topology: NodeTopology) -> NodeProfile:
    """The node's profile with its NodeResourceTopology's facts preferred over its labels'."""
    return dataclasses.replace(
        profile,
        numa_nodes=len(topology.zones),
        numa_source=NUMA_SOURCE,
        numa_cpus=tuple(z.cpus for z in topology.zones),
        numa_memory_bytes=tuple(z.memory_bytes for z in topology.zones),
        topology_manager_policy=topology.topology_manager_policy or profile.topology_manager_policy,
    )
