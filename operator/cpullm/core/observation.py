"""What one reconcile observed, gathered before anything is decided (controller/gather.py for the operator,
io/files.py for the CLI): the input of core/decision.py's `decide`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cpullm.api.spec import CpuLLMServiceSpec, NetworkPolicyPeer
from cpullm.core.children.common import Owner
from cpullm.core.children.sizing_job import VllmSizing
from cpullm.core.constants import DEFAULT_ROUTER_IMAGE
from cpullm.core.daemonsets import DaemonPods
from cpullm.core.node_facts import NodeFact
from cpullm.core.performance_check import PerformanceVerdict
from cpullm.core.pod_troubles import PodTrouble
from cpullm.core.server_exits import ServerExit
from cpullm.core.sizing import ModelSize
from cpullm.core.topology import NodeProfile
from cpullm.errors import CpuLLMError


@dataclass(frozen=True)
class NamespaceFacts:
    """What the service's namespace says: its labels (Pod Security), whether it is going away, and its UID (which
    keys the node cache directories: a namespace made again under the same name has another; offline, where there
    is no Namespace object, children/model_cache.py's UNKNOWN_NAMESPACE_UID; None: not read)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    terminating: bool = False
    uid: str | None = None


@dataclass(frozen=True)
class OperatorPolicy:
    """What the operator's administrator chose (settings.py, from the chart's values): the same for every service.

    `node_cache_dir`: where spec.modelCache.nodeLocal keeps its files (None: nodeLocal is refused);
    `router_image`: the router of a spec that names none; `vllm_images`: the vLLM image per arch of a spec that
    names none; `numa_seccomp_profile`: a Localhost seccomp profile on every node (the chart's numaSeccomp) that
    lets vLLM's NUMA calls through without SYS_NICE, for namespaces whose Pod Security refuses SYS_NICE (None:
    there is none, and such namespaces run servers without NUMA calls or not at all: core/podsecurity.py);
    `max_concurrent_rollouts`: how many services may roll their servers out at once for a template change their
    user did not ask for (core/rollout.py; None: no limit); `operator_peer`: the operator's pods, which the servers'
    NetworkPolicies admit on their API port for the performance check (None: not admitted)."""

    node_cache_dir: str | None = None
    router_image: str = DEFAULT_ROUTER_IMAGE
    vllm_images: Mapping[str, str] = field(default_factory=dict)
    numa_seccomp_profile: str | None = None
    max_concurrent_rollouts: int | None = None
    operator_peer: NetworkPolicyPeer | None = None


# Every choice left at its default (settings.py's defaults build the same).
DEFAULT_POLICY = OperatorPolicy()


@dataclass(frozen=True)
class Ownership:
    """An existing object as the operator reads it before writing it (or its watch last showed it): which object
    (uid, resourceVersion) and which object controls it."""

    uid: str
    controller_uid: str | None
    resource_version: str = ""


@dataclass(frozen=True)
class ChildSeen:
    """A child as the operator's watch last showed it."""

    kind: str
    namespace: str
    name: str
    ownership: Ownership


@dataclass(frozen=True)
class ClusterView:
    """What the cluster shows one reconcile, read whole at its entrance: Kopf's indexes for the operator
    (controller/dispatch.py), files for the CLI (commands.py). `nodes` are the nodes' profiles from their labels,
    refined in gather by what other sources say of them (`node_facts`: core/node_facts.py, NodeResourceTopologies);
    `daemons` the DaemonSets whose pods whole-node plans leave room for; `deployment` the servers' Deployment as last
    seen (its generation, template digest, replicas and status); `installed_crds` the optional APIs' CRDs installed
    (None: unknown, assume all); `pod_trouble` why one of the service's pods cannot start or keep running;
    `server_exits` its server pods' last ends that report fixes not loaded; `performance` the last verdict on its
    servers' speed (core/performance_check.py); `children` its watched children (of the kinds watched) as the
    watches last showed them, which spares the read before a write (controller/reconcile.py); `gateways` the names
    of the CpuLLMGateways that front it (their pods are admitted where allowedFrom narrows who may call it)."""

    nodes: Sequence[NodeProfile] = ()
    node_facts: Sequence[NodeFact] = ()
    daemons: Sequence[DaemonPods] = ()
    deployment: Mapping[str, Any] | None = None
    installed_crds: frozenset[str] | None = None
    pod_trouble: PodTrouble | None = None
    server_exits: Sequence[ServerExit] = ()
    performance: PerformanceVerdict | None = None  # the servers' speed against the plan's, last judged
    children: Sequence[ChildSeen] = ()
    gateways: Sequence[str] = ()


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile of one CpuLLMService needs, gathered before anything is decided.

    `spec` is the parsed spec or why it could not be parsed; `model` the model's size, why it could not be
    had, or None when it was not looked up (bad spec, terminating namespace); `status` is the status as the
    operator last wrote it (the object's own after a restart); `apply_error` is what the API server answered
    when the children of an earlier decision were applied, if it refused them; `pod_trouble` why one of its
    pods cannot start or keep running (core/pod_troubles.py); `server_exits` its server pods' last ends whose
    report names fixes that did not load (core/server_exits.py); `deployment` the servers' Deployment as Kopf's
    index holds it (its generation, template digest and replicas, and its status).
    """

    owner: Owner
    generation: int
    spec: CpuLLMServiceSpec | CpuLLMError
    requested_replicas: int
    namespace: NamespaceFacts = field(default_factory=NamespaceFacts)
    model: ModelSize | CpuLLMError | None = None
    nodes: Sequence[NodeProfile] = ()
    daemons: Sequence[DaemonPods] = ()  # the DaemonSets whose pods' requests whole-node plans leave room for
    deployment: Mapping[str, Any] | None = None
    pod_trouble: PodTrouble | None = None
    server_exits: Sequence[ServerExit] = ()
    performance: PerformanceVerdict | None = None  # core/performance_check.py's last verdict on its servers
    status: Mapping[str, Any] = field(default_factory=dict)
    apply_error: CpuLLMError | None = None
    # The optional APIs' CRDs installed in the cluster (children/OPTIONAL_APIS); None: unknown, assume all
    # (offline rendering prints every child the spec asks for).
    installed_crds: frozenset[str] | None = None
    policy: OperatorPolicy = field(default_factory=OperatorPolicy)
    # The servers' new pod template must wait: other services use every rollout slot (controller/pacing.py).
    rollout_held: bool = False
    # What vLLM's sizing of a model no formula knows gave this reconcile (controller/vllm_sizing.py).
    sizing: VllmSizing = field(default_factory=VllmSizing)
    # The CpuLLMGateways in front of it (by name): admitted by its NetworkPolicies where allowedFrom is set.
    gateways: Sequence[str] = ()
