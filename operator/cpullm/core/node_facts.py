"""Where the operator learns a node's shape beyond its labels (core/topology.py): one registry line per kind of object
that says something about a node, with how it is read and how it refines the node's profile. A new source (NFD's
NodeFeature, the kubelet's configz) is one module with a parse and a refine function, and one line here; what the
rest of the operator needs of it derives from the line: Kopf's index and watch (controller/handlers.py), the reaction
to its events (controller/dispatch.py), the merge into the profiles a plan reads (refine_profiles, in gather), the
listing of `cpullm plan --from-cluster` (io/kube.py) and the reading of a nodes file (io/files.py). The chart grants
each source's verbs (tests/unit/test_rbac.py checks it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cpullm.api import performance as performance_api
from cpullm.api.spec import GROUP, VERSION
from cpullm.core import node_topology
from cpullm.core.api_resources import ApiResource
from cpullm.core.performance import NodePerformance, parse_performance
from cpullm.core.topology import NodeProfile
from cpullm.errors import CpuLLMError, NodePerformanceError, NodeTopologyError


class NodeFact(Protocol):
    """What a source says of one node (NodeTopology, ...): the node it is about, by name."""

    @property
    def node(self) -> str: ...


@dataclass(frozen=True)
class NodeFactSource(ApiResource):
    """A kind of object that describes a node: its API, how one is read (a `fact_type`; raising `error` when it cannot
    be used: its node is then planned from its labels), and how what it says refines the node's profile."""

    index: str  # Kopf's index of the parsed objects, by node name (an index's name is its handler's id)
    fact_type: type
    parse: Callable[[Mapping[str, Any]], NodeFact]
    error: type[CpuLLMError]
    refine: Callable[[NodeProfile, Any], NodeProfile]
    verbs: tuple[str, ...] = ("list", "watch")  # cluster-wide, as nodes


def with_performance(profile: NodeProfile, performance: NodePerformance) -> NodeProfile:
    return dataclasses.replace(profile, performance=performance)


NODE_FACT_SOURCES: tuple[NodeFactSource, ...] = (
    NodeFactSource(
        f"{node_topology.GROUP}/{node_topology.VERSION}",
        node_topology.KIND,
        node_topology.PLURAL,
        "node_topologies",
        node_topology.NodeTopology,
        node_topology.parse_topology,
        NodeTopologyError,
        node_topology.with_topology,
    ),
    NodeFactSource(
        f"{GROUP}/{VERSION}",
        performance_api.KIND,
        performance_api.PLURAL,
        "node_performances",
        NodePerformance,
        parse_performance,
        NodePerformanceError,
        with_performance,
    ),
)
SOURCE_OF_PLURAL = {source.plural: source for source in NODE_FACT_SOURCES}


def refine_profiles(profiles: Sequence[NodeProfile], facts: Iterable[NodeFact]) -> list[NodeProfile]:
    """Each node's profile refined by what the sources say of it, in the registry's order (a later source's facts
    over an earlier's)."""
    by_source: dict[str, dict[str, NodeFact]] = {}
    for fact in facts:
        source = next((s for s in NODE_FACT_SOURCES if isinstance(fact, s.fact_type)), None)
        if source is not None:
            by_source.setdefault(source.kind, {})[fact.node] = fact
    if not by_source:
        return list(profiles)
    refined = []
    for profile in profiles:
        for source in NODE_FACT_SOURCES:
            said = by_source.get(source.kind, {}).get(profile.name)
            if said is not None:
                profile = source.refine(profile, said)
        refined.append(profile)
    return refined
