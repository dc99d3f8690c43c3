"""Node objects -> NodeProfile: what the planner needs to know about one node, read from its labels.

The label contract (README, "Node labels"):
- NUMA count: `cpullm.io/numa-nodes` (explicit), else `feature.node.kubernetes.io/memory-numa.node_count`
  (published by an NFD NodeFeatureRule from feature `memory.numa`), else 1; but a node NFD labels
  `feature.node.kubernetes.io/memory-numa=true` (its default labels: more than one NUMA node) without a count is
  known to be multi-NUMA with an unknown count, and no plan guesses one for it (core/eligibility.py).
- ISA: `feature.node.kubernetes.io/cpu-cpuid.<FLAG>=true` (NFD), overridden by `cpullm.io/isa.<flag>=true|false`.
- SMT: `feature.node.kubernetes.io/cpu-hardware_multithreading=true|false`.
- CPU manager policy: `cpullm.io/cpu-manager-policy=static|none` (the kubelet does not publish it).
- Topology manager policy: `cpullm.io/topology-manager-policy=none|best-effort|restricted|single-numa-node`
  (the kubelet does not publish it either); throughput placement is exact only with `restricted` or
  `single-numa-node`, which keep a pod's CPUs on one NUMA node.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from cpullm.api.isa import lscpu_name
from cpullm.api.plan import NodeProfileSummary, NodeShape
from cpullm.core.memo import Hashed, cached
from cpullm.core.performance import NodePerformance
from cpullm.errors import NodeLabelError

NFD_PREFIX = "feature.node.kubernetes.io/"
NFD_CPUID_PREFIX = NFD_PREFIX + "cpu-cpuid."
NFD_NUMA_COUNT = NFD_PREFIX + "memory-numa.node_count"
NFD_SMT = NFD_PREFIX + "cpu-hardware_multithreading"
NUMA_NODES_LABEL = "cpullm.io/numa-nodes"
NUMA_SOURCE_DEFAULT = "default"  # no label gave the NUMA count: 1 is assumed
NFD_MULTI_NUMA = NFD_PREFIX + "memory-numa"  # NFD's default label: "true" on a node of more than one NUMA node
NUMA_SOURCE_UNCOUNTED = NFD_MULTI_NUMA  # more than one NUMA node, none of the labels says how many
NUMA_COUNT_LABELS = (NUMA_NODES_LABEL, NFD_NUMA_COUNT)  # where a node's NUMA count is read from, first wins
ISA_LABEL_PREFIX = "cpullm.io/isa."
CPU_MANAGER_POLICY_LABEL = "cpullm.io/cpu-manager-policy"
TOPOLOGY_MANAGER_POLICY_LABEL = "cpullm.io/topology-manager-policy"
TOPOLOGY_MANAGER_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
# Topology manager policies that keep a pod's CPUs on one NUMA node when it fits one.
NUMA_ALIGNING_POLICIES = frozenset({"restricted", "single-numa-node"})
ARCH_LABEL = "kubernetes.io/arch"
MAX_NUMA_NODES = 64
# What an hour of the whole node costs, in the admin's currency (a decimal): the plan's predicted cost per million
# generated tokens is worked out from it. Node labels are the admin's, never a tenant's.
PRICE_LABEL = "cpullm.io/price-per-hour"
MAX_PRICE_PER_HOUR = Decimal(10) ** 6


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None
    effect: str


@dataclass(frozen=True)
class NodeProfile:
    name: str
    arch: str
    cpus: int
    memory_bytes: int
    numa_nodes: int
    numa_source: str
    isa: frozenset[str]
    smt: bool | None
    cpu_manager_policy: str | None
    topology_manager_policy: str | None = None
    unschedulable: bool = False
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    taints: tuple[Taint, ...] = ()
    # The allocatable CPU in millicores (None: `cpus` whole): what DaemonSets' requests are taken from
    # (core/daemonsets.py).
    cpu_millis: int | None = None
    # Allocatable CPUs and memory of each NUMA node, where a source reports them (core/node_topology.py); empty:
    # unknown, an even split of the node's is assumed.
    numa_cpus: tuple[int, ...] = ()
    numa_memory_bytes: tuple[int, ...] = ()
    # What its cores measured (a NodePerformance, core/performance.py), where a probe ran on it; not part of its shape:
    # a shape is planned with its slowest member's.
    performance: NodePerformance | None = field(default=None, compare=False, hash=False)
    # PRICE_LABEL's figure, where the admin labelled one; not part of its shape.
    price_per_hour: float | None = field(default=None, compare=False, hash=False)

    @property
    def allocatable_cpu_millis(self) -> int:
        return self.cpus * 1000 if self.cpu_millis is None else self.cpu_millis

    @functools.cached_property  # a profile lives in the node index, and every reconcile groups nodes by it
    def shape(self) -> NodeShape:
        """Nodes with the same shape get the same plan; memory may differ (the profile takes the least)."""
        return NodeShape(
            arch=self.arch,
            numa_nodes=self.numa_nodes,
            cpus=self.cpus,
            smt=self.smt,
            cpu_manager_policy=self.cpu_manager_policy,
            topology_manager_policy=self.topology_manager_policy,
            isa=tuple(self.isa),
            numa_cpus=self.numa_cpus,
        )

    @cached  # a profile lives in the node index: each reconcile's plan reads its key again
    def planning_key(self) -> Hashed:
        """Everything the planner reads of this node, hashed once: its equality's fields and what they leave out
        (measured speed, price, labels). The planner's memo of whole plans keys on it (core/planner.py)."""
        labels = tuple(sorted(self.labels.items()))
        return Hashed((self, self.performance, self.price_per_hour, labels))

    def summary(self, memory_bytes: int) -> NodeProfileSummary:
        """Its shape as status.plan stores it, with `memory_bytes` (a shape's least)."""
        return NodeProfileSummary(**dict(self.shape), numa_source=self.numa_source, memory_bytes=memory_bytes)

    @property
    def cpus_per_numa_node(self) -> int:
        """The CPUs of its smallest NUMA node: as reported, else an even share."""
        even = self.cpus // self.numa_nodes
        return min(even, *self.numa_cpus) if self.numa_cpus else even


_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
# Milli, the decimal multiples (powers of 1000) and the binary ones (powers of 1024).
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{prefix: Decimal(1000) ** power for power, prefix in enumerate("kMGTPE", 1)},
    **{prefix + "i": Decimal(1024) ** power for power, prefix in enumerate("KMGTPE", 1)},
}


# Kubernetes keeps a quantity in an int64: anything larger is no quantity the API server would store.
MAX_QUANTITY = Decimal(2**63 - 1)


def parse_quantity(text: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ('15900m', '64Gi', '1e9') as a Decimal; ValueError when it is none, or
    is beyond what Kubernetes stores (int64)."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"not a quantity: {type(text).__name__}")
    if isinstance(text, int) and abs(text) > MAX_QUANTITY:
        raise ValueError(f"quantity out of range (larger than {MAX_QUANTITY})")
    shown = repr(text) if len(str(text)) <= 40 else repr(str(text)[:37] + "...")
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {shown}")
    try:
        value = Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except ArithmeticError as err:  # InvalidOperation ('1..2'), Overflow ('1e999999999')
        raise ValueError(f"not a quantity: {shown}") from err
    if abs(value) > MAX_QUANTITY:
        raise ValueError(f"quantity out of range: {shown} is larger than {MAX_QUANTITY}")
    return value


def parse_node(node: Mapping[str, Any]) -> NodeProfile:
    """Read one Node object (as the API returns it). Raises NodeLabelError when a label cannot be used."""
    metadata = node.get("metadata") or {}
    name = str(metadata.get("name", ""))
    labels: Mapping[str, str] = metadata.get("labels") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}

    def fail(why: str) -> NodeLabelError:
        return NodeLabelError(f"node {name}: {why}")

    if not isinstance(labels, Mapping):
        raise fail(f"labels must be a map of strings, not {type(labels).__name__}")
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            # The API server stores only strings; a node file can hold unquoted YAML numbers or booleans.
            raise fail(f"label {key}={value!r} is not a string (quote it in YAML)")
    if "cpu" not in allocatable or "memory" not in allocatable:
        raise fail(
            "no allocatable cpu and memory in its status (a nodes file must hold what `kubectl get nodes -o yaml` "
            "prints, status included)"
        )
    cpu_millis = _allocatable(allocatable, "cpu", fail, scale=1000)
    memory_bytes = _allocatable(allocatable, "memory", fail)

    numa_nodes, numa_source = 1, NUMA_SOURCE_DEFAULT
    for label in NUMA_COUNT_LABELS:
        if label in labels:
            value = labels[label]
            if not value.isdigit() or not 1 <= int(value) <= MAX_NUMA_NODES:
                raise fail(f"label {label}={value!r} is not a NUMA node count (1-{MAX_NUMA_NODES})")
            numa_nodes, numa_source = int(value), label
            break
    else:
        if labels.get(NFD_MULTI_NUMA) == "true":
            numa_source = NUMA_SOURCE_UNCOUNTED

    isa: set[str] = set()
    overrides: dict[str, bool] = {}
    for key, value in labels.items():
        if key.startswith(NFD_CPUID_PREFIX):
            if _parse_bool(key, value, fail):
                isa.add(lscpu_flag(key))
        elif key.startswith(ISA_LABEL_PREFIX):
            overrides[key[len(ISA_LABEL_PREFIX) :]] = _parse_bool(key, value, fail)
    for flag, present in overrides.items():
        (isa.add if present else isa.discard)(flag)

    smt = _parse_bool(NFD_SMT, labels[NFD_SMT], fail) if NFD_SMT in labels else None
    policy = labels.get(CPU_MANAGER_POLICY_LABEL)
    if policy is not None and policy not in ("static", "none"):
        raise fail(f"label {CPU_MANAGER_POLICY_LABEL}={policy!r} is not 'static' or 'none'")
    topology_policy = labels.get(TOPOLOGY_MANAGER_POLICY_LABEL)
    if topology_policy is not None and topology_policy not in TOPOLOGY_MANAGER_POLICIES:
        allowed = ", ".join(TOPOLOGY_MANAGER_POLICIES)
        raise fail(f"label {TOPOLOGY_MANAGER_POLICY_LABEL}={topology_policy!r} is not one of {allowed}")

    arch = labels.get(ARCH_LABEL) or (status.get("nodeInfo") or {}).get("architecture") or "unknown"
    price = _price(labels[PRICE_LABEL], fail) if PRICE_LABEL in labels else None
    taints = tuple(
        Taint(key=t.get("key", ""), value=t.get("value"), effect=t.get("effect", "")) for t in spec.get("taints") or []
    )
    return NodeProfile(
        name=name,
        arch=arch,
        cpus=cpu_millis // 1000,
        memory_bytes=memory_bytes,
        numa_nodes=numa_nodes,
        numa_source=numa_source,
        isa=frozenset(isa),
        smt=smt,
        cpu_manager_policy=policy,
        topology_manager_policy=topology_policy,
        unschedulable=bool(spec.get("unschedulable", False)),
        labels=dict(labels),
        taints=taints,
        cpu_millis=cpu_millis,
        price_per_hour=price,
    )


def _price(value: str, fail: Any) -> float:
    try:
        price = Decimal(value)
    except ArithmeticError:
        price = Decimal("NaN")
    if not price.is_finite() or not 0 <= price <= MAX_PRICE_PER_HOUR:
        raise fail(
            f"label {PRICE_LABEL}={value!r} is not a price per hour of the node (a decimal number from 0 to "
            f"{MAX_PRICE_PER_HOUR:,}, e.g. '3.25')"
        )
    return float(price)


def _allocatable(allocatable: Mapping[str, Any], resource: str, fail: Any, scale: int = 1) -> int:
    """A node's allocatable cpu or memory in whole units, or in 1/scale of one (0 when not given)."""
    value = allocatable.get(resource, 0)
    try:
        amount = math.floor(parse_quantity(value) * scale)
    except ValueError as err:
        raise fail(f"allocatable {resource}: {err}") from err
    if amount < 0:
        raise fail(f"allocatable {resource}={value!r} is negative")
    return amount


def lscpu_flag(nfd_label: str) -> str:
    """The lscpu name of an NFD cpuid label: feature.node.kubernetes.io/cpu-cpuid.AMXBF16 -> amx_bf16."""
    return lscpu_name(nfd_label[len(NFD_CPUID_PREFIX) :])


def _parse_bool(key: str, value: str, fail: Any) -> bool:
    if value not in ("true", "false"):
        raise fail(f"label {key}={value!r} is not 'true' or 'false'")
    return value == "true"


# What the planner can know of one node: its profile, why its labels cannot be used, or nothing (gone).
NodeState = NodeProfile | NodeLabelError | None


def node_state_changed(before: NodeState, after: NodeState) -> bool:
    """Whether a node event can change a plan: a new, removed or reshaped node, other labels (selectors and
    affinity read them), taints or cordoning, other measured figures (a NodePerformance: the plan's prediction, and
    the shape it chooses, read them), or a different label error. Heartbeats and status noise (conditions, images,
    addresses) leave the profile as it was and do not count."""
    if isinstance(before, NodeLabelError) and isinstance(after, NodeLabelError):
        return before.message != after.message
    if isinstance(before, NodeProfile) and isinstance(after, NodeProfile):
        return before != after or before.labels != after.labels or before.performance != after.performance
    return before is not after
