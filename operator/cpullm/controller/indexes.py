"""Kopf's indexes, typed: read once by name from a handler's keyword arguments (`KopfIndexes.of`), then passed whole
through controller/dispatch.py, so no event's path reads Kopf's arguments by string key.

Kopf mutates its indexes on the event loop; they are read there (copied into a `Snapshot`) before a reconcile goes
to a worker thread. Each index maps a key to a store of values; {} means "not in the index".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cpullm.core.children import WATCHED_KINDS
from cpullm.core.daemonsets import DaemonPods
from cpullm.core.gateway import fronts
from cpullm.core.node_facts import NODE_FACT_SOURCES, NodeFact, refine_profiles
from cpullm.core.observation import ChildSeen, ClusterView
from cpullm.core.topology import NodeProfile

Index = Mapping[Any, Any]  # a Kopf index: key -> store of values


def seen_index(plural: str) -> str:
    """The index of a watched child kind's objects (handlers.py's seen_children), by the kind's plural."""
    return f"seen_{plural}"


def indexed(index: Index) -> list[Any]:
    """Every value an index holds (the node profiles, the DaemonSets' pods, the services)."""
    return [value for store in index.values() for value in store]


def first(index: Index, key: Any) -> Any:
    return next(iter(index.get(key, ())), None)


def fronting_gateways(gateways: Index, key: tuple[str, str]) -> list[Any]:
    """The CpuLLMGateways of the service's namespace that list it, from Kopf's index of them."""
    namespace, name = key
    return [g for (ns, _), bodies in gateways.items() if ns == namespace for g in bodies if fronts(g, name)]


@dataclass(frozen=True)
class KopfIndexes:
    """Every index handlers.py declares, by its name there (core/node_facts.py's sources by their `index`)."""

    node_profiles: Index
    node_facts: Mapping[str, Index]  # per node-fact source's index name
    daemonset_pods: Index
    installed_crds: Index
    services: Index
    gateways: Index
    owned_deployments: Index
    pod_troubles: Index  # these three: (ReplicaSet UID, fact) pairs by service; read through owned_pods
    server_exits: Index
    server_addresses: Index
    server_replicasets: Index
    seen_children: Mapping[str, Index]  # per watched child kind's index name

    @classmethod
    def of(cls, kwargs: Mapping[str, Any]) -> KopfIndexes:
        """The indexes among the keyword arguments Kopf passed a handler."""
        return cls(
            node_profiles=kwargs["node_profiles"],
            node_facts={source.index: kwargs[source.index] for source in NODE_FACT_SOURCES},
            daemonset_pods=kwargs["daemonset_pods"],
            installed_crds=kwargs["installed_crds"],
            services=kwargs["services"],
            gateways=kwargs["gateways"],
            owned_deployments=kwargs["owned_deployments"],
            pod_troubles=kwargs["pod_troubles"],
            server_exits=kwargs["server_exits"],
            server_addresses=kwargs["server_addresses"],
            server_replicasets=kwargs["server_replicasets"],
            seen_children={seen_index(k.plural): kwargs[seen_index(k.plural)] for k in WATCHED_KINDS},
        )

    def without_deployments(self, keys: set[tuple[str, str]]) -> KopfIndexes:
        """These services' Deployments left out (the index still holds a vanished one's last status)."""
        return replace(self, owned_deployments={k: v for k, v in self.owned_deployments.items() if k not in keys})

    def owned_pods(self, index: Index, key: tuple[str, str]) -> list[Any]:
        """The facts a pod index holds for a service, of its own servers only: pods whose ReplicaSet the service's
        Deployment controls (a pod's service label alone could be anyone's)."""
        deployment = first(self.owned_deployments, key)
        uid = ((deployment or {}).get("metadata") or {}).get("uid")
        if not uid:
            return []
        return [fact for rs, fact in index.get(key, ()) if first(self.server_replicasets, (key[0], rs)) == uid]

    def children(self, key: tuple[str, str]) -> tuple[ChildSeen, ...]:
        """A service's watched children (filed by their service label) as the watches last showed them."""
        return tuple(seen for index in self.seen_children.values() for seen in index.get(key, ()))

    def service(self, key: tuple[str, str]) -> list[Any]:
        """The service of that (namespace, name), as a list of none or one."""
        return list(self.services.get(key, ()))

    def usable_node_facts(self, name: str | None = None) -> list[NodeFact]:
        """What the node-fact sources say that can be used (of one node, or of all): each source's facts, not the
        errors of objects that cannot be read (their nodes are planned from their labels)."""
        found: list[NodeFact] = []
        for source in NODE_FACT_SOURCES:
            index = self.node_facts[source.index]
            values = index.get(name, ()) if name is not None else indexed(index)
            found += [fact for fact in values if not isinstance(fact, source.error)]
        return found

    def node_profile(self, name: str) -> NodeProfile | None:
        """A node's profile as the planner sees it: its labels', refined by what the node-fact sources say of it
        (None: the node is not in the index)."""
        profile = first(self.node_profiles, name)
        return None if profile is None else refine_profiles([profile], self.usable_node_facts(name))[0]

    def snapshot(self) -> Snapshot:
        return Snapshot(self)


class Snapshot:
    """What the indexes hold for reconciles, copied on the event loop once a reconcile holds a worker slot
    (controller/workers.py: a waiting reconcile holds no copies). Each service's ClusterView is taken from it."""

    def __init__(self, indexes: KopfIndexes) -> None:
        self.nodes: list[NodeProfile] = indexed(indexes.node_profiles)
        self.node_facts = indexes.usable_node_facts()
        self.daemons: list[DaemonPods] = indexed(indexes.daemonset_pods)
        self.crds = frozenset(indexes.installed_crds.keys())
        self._indexes = indexes

    def view(self, key: tuple[str, str]) -> ClusterView:
        return ClusterView(
            nodes=self.nodes,
            node_facts=self.node_facts,
            daemons=self.daemons,
            deployment=first(self._indexes.owned_deployments, key),
            installed_crds=self.crds,
            pod_trouble=next(iter(self._indexes.owned_pods(self._indexes.pod_troubles, key)), None),
            server_exits=tuple(self._indexes.owned_pods(self._indexes.server_exits, key)),
            children=self._indexes.children(key),
            gateways=tuple(sorted(g["metadata"]["name"] for g in fronting_gateways(self._indexes.gateways, key))),
        )
