"""The room DaemonSets take on a node: a whole-node plan asks for what is left of its allocatable CPU and memory.

A node's allocatable already leaves out the kubelet's reservations (kubeReserved, systemReserved, eviction
thresholds); the pods of every DaemonSet that runs there take their requests out of it too, so a plan of all
allocatable CPUs of a node running kind's kindnet (100m) or a monitoring agent would stay Pending. A DaemonSet
runs on a node as the scheduler places its pods: its template's nodeSelector and required node affinity match
the node's labels, and its tolerations (plus those the DaemonSet controller adds to every daemon pod) tolerate the
node's NoSchedule and NoExecute taints. The checks are the eligibility chain's own (core/eligibility.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pydantic

from cpullm.api.spec import Affinity, Toleration
from cpullm.core.eligibility import ELIGIBILITY_CHECKS, Needs, node_rejection
from cpullm.core.memo import Hashed, cached
from cpullm.core.topology import NodeProfile, parse_quantity

# The checks that place a daemon pod: a DaemonSet's pods run on cordoned nodes too, whatever their image or ISA.
PLACEMENT_CHECKS = tuple(
    check for check in ELIGIBILITY_CHECKS if check.name in ("nodeSelector", "nodeAffinity", "taints")
)
# What the DaemonSet controller adds to every daemon pod (network-unavailable only with hostNetwork).
_DAEMON_TOLERATIONS = (
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
)
_HOST_NETWORK_TOLERATION = ("node.kubernetes.io/network-unavailable", "NoSchedule")


class DaemonSetUnreadable(ValueError):
    """A DaemonSet whose pod template cannot be read (it is then left out, with a log line)."""


@dataclass(frozen=True)
class DaemonPods:
    """What one DaemonSet's pod requests on each node it runs on, and where it runs."""

    name: str  # namespace/name
    cpu_millis: int
    memory_bytes: int
    needs: Needs  # its checks: only those that can fail (none: it runs on every node)

    def runs_on(self, node: NodeProfile) -> bool:
        return not self.needs.checks or node_rejection(self.needs, node) is None

    @cached  # it lives in the DaemonSet index: each reconcile's plan reads its key again
    def planning_key(self) -> Hashed:
        """Everything a plan reads of it, hashed once, for the planner's memo (its needs hold lists and mappings,
        which do not hash; their checks follow from the rest)."""
        needs = self.needs
        terms = tuple(term.model_dump_json() for term in needs.required_terms)
        tolerations = tuple(toleration.model_dump_json() for toleration in needs.tolerations)
        selector = tuple(sorted(needs.node_selector.items()))
        where = (needs.image, needs.required_isa, selector, terms, tolerations, needs.model, needs.fp8_kv_cache)
        return Hashed((self.name, self.cpu_millis, self.memory_bytes, where))


@dataclass(frozen=True)
class Room:
    """What the DaemonSets running on a node take there (and the router, when the plan has one)."""

    cpu_millis: int = 0
    memory_bytes: int = 0
    takers: tuple[str, ...] = ()  # what takes it, as the plan's note names them

    def plus(self, taker: str, cpu_millis: int, memory_bytes: int) -> Room:
        return Room(self.cpu_millis + cpu_millis, self.memory_bytes + memory_bytes, (*self.takers, taker))

    def cpus_left(self, node: NodeProfile) -> int:
        """The whole CPUs of the node's allocatable that this room leaves (1.9 less 0.1 is 1)."""
        return max(0, node.allocatable_cpu_millis - self.cpu_millis) // 1000


NO_ROOM = Room()


def rooms_on(nodes: Sequence[NodeProfile], daemons: Sequence[DaemonPods]) -> list[Room]:
    """The room on each node: DaemonSets that run everywhere are not asked per node, and nodes that run the same
    DaemonSets share one Room (asked of thousands of nodes per plan)."""
    selective = [(i, d) for i, d in enumerate(daemons) if d.needs.checks]
    rooms: dict[tuple[int, ...], Room] = {}  # keyed by which of the selective ones run there
    found = []
    for node in nodes:
        key = tuple(i for i, d in selective if d.runs_on(node))
        room = rooms.get(key)
        if room is None:
            chosen = set(key)
            room = rooms[key] = _room([d for i, d in enumerate(daemons) if not d.needs.checks or i in chosen])
        found.append(room)
    return found


def _room(running: Sequence[DaemonPods]) -> Room:
    if not running:
        return NO_ROOM
    names = tuple(sorted(d.name for d in running))  # in a stable order: the plan's note says them
    return Room(sum(d.cpu_millis for d in running), sum(d.memory_bytes for d in running), names)


def parse_daemonset(daemonset: Mapping[str, Any]) -> DaemonPods | None:
    """The daemon pods of a DaemonSet object, or None when they request no CPU and no memory (nothing to leave).
    Raises DaemonSetUnreadable for a template the API server would not have stored."""
    meta = daemonset.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    pod = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    try:
        cpu, memory = _pod_request(pod, "cpu"), _pod_request(pod, "memory")
        tolerations = [Toleration.model_validate(t) for t in pod.get("tolerations") or []]
        affinity = pod.get("affinity")
        terms = Affinity.model_validate(affinity).required_node_terms if affinity else []
    except (ValueError, TypeError, AttributeError, pydantic.ValidationError) as err:
        raise DaemonSetUnreadable(f"DaemonSet {name}: {getattr(err, 'message', err)}") from err
    if cpu == 0 and memory == 0:
        return None
    added = [*_DAEMON_TOLERATIONS, *((_HOST_NETWORK_TOLERATION,) if pod.get("hostNetwork") else ())]
    tolerations += [Toleration(key=key, operator="Exists", effect=effect) for key, effect in added]
    selector = pod.get("nodeSelector") or {}
    # Only the checks that can fail, each asked of thousands of nodes: most agents select no node and tolerate
    # every taint (kind's kindnet, node exporters), and run everywhere.
    universal = any(t.operator == "Exists" and not t.key and not t.effect for t in tolerations)
    skip = {"nodeSelector": not selector, "nodeAffinity": not terms, "taints": universal}
    checks = tuple(check for check in PLACEMENT_CHECKS if not skip[check.name])
    needs = Needs(None, frozenset(), selector, terms, tuple(tolerations), None, False, checks)
    return DaemonPods(name, math.ceil(cpu * 1000), math.ceil(memory), needs)


def _pod_request(pod: Mapping[str, Any], resource: str) -> Decimal:
    """A pod's effective request as the scheduler counts it: its containers and sidecars (restartable init
    containers) together, or its largest init container if that is more, plus the pod overhead. A container
    without a request but with a limit requests its limit (the API server's defaulting)."""

    def request(container: Mapping[str, Any]) -> Decimal:
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(resource, (resources.get("limits") or {}).get(resource))
        return Decimal(0) if amount is None else parse_quantity(amount)

    inits = pod.get("initContainers") or []
    sidecars = [c for c in inits if c.get("restartPolicy") == "Always"]
    running = sum((request(c) for c in [*(pod.get("containers") or []), *sidecars]), Decimal(0))
    starting = max((request(c) for c in inits if c.get("restartPolicy") != "Always"), default=Decimal(0))
    overhead = (pod.get("overhead") or {}).get(resource)
    return max(running, starting) + (parse_quantity(overhead) if overhead is not None else Decimal(0))
