"""The planner: (spec, model size, node profiles) -> Plan, or a typed PlanRefusal. Pure.

1. Eligible nodes: schedulable, arch with an image, required ISA present, nodeSelector and required node
   affinity match, every NoSchedule/NoExecute taint tolerated.
2. Eligible nodes are grouped by shape (arch, NUMA count, CPUs, ISA, SMT, CPU manager policy); each shape is
   planned on its own, with the least memory among its nodes.
3. TP: explicit, or one rank per NUMA node stepped down to the largest size vLLM supports (divides the
   attention heads, divides or is a multiple of the KV heads, never 6).
4. KV per rank: explicit, or ceil(maxModelLen x maxNumSeqs x KV bytes per token per rank / GiB); either way
   it must hold one sequence of the context length (vLLM refuses to start otherwise).
5. Memory: see MemoryBudget; every NUMA node must hold its ranks, the node the whole pod.
6. Among the shapes that fit, prefer one with enough nodes for every replica, then more ranks, then more
   nodes; ties broken by shape for determinism.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpullm.api.plan import NodeProfileSummary, Plan
from cpullm.api.spec import EXPLICIT_BIND_PATTERN, CpuLLMServiceSpec, ThreadsBindMode, Toleration
from cpullm.core import constants as c
from cpullm.core.sizing import ModelSize
from cpullm.core.topology import NodeProfile, Taint
from cpullm.errors import (
    InvalidTensorParallelSize,
    KVCacheTooSmall,
    ModelTooLarge,
    NoEligibleNode,
    PlanRefusal,
    name_list,
)


def plan_service(spec: CpuLLMServiceSpec, model: ModelSize, nodes: Sequence[NodeProfile]) -> Plan:
    explicit_tp = _explicit_tensor_parallel_size(spec)
    if explicit_tp is not None:
        _check_tensor_parallel_size(explicit_tp, model)

    eligible: list[NodeProfile] = []
    rejections: dict[str, str] = {}
    for node in nodes:
        why = node_rejection(spec, node)
        if why is None:
            eligible.append(node)
        else:
            rejections[node.name] = why
    if not eligible:
        raise NoEligibleNode(rejections)

    shapes: dict[tuple[object, ...], list[NodeProfile]] = {}
    for node in eligible:
        shapes.setdefault(node.shape, []).append(node)

    plans: list[Plan] = []
    refusals: list[PlanRefusal] = []
    for members in shapes.values():
        try:
            plans.append(_plan_for_shape(spec, model, members, explicit_tp))
        except PlanRefusal as refusal:
            refusals.append(refusal)
            for node in members:
                rejections[node.name] = refusal.message
    if not plans:
        if len(refusals) == 1:
            raise refusals[0]
        raise NoEligibleNode(rejections)
    return max(plans, key=lambda p: _preference(p, spec.replicas))


def _preference(plan: Plan, replicas: int) -> tuple[object, ...]:
    profile = plan.node_profile
    return (
        len(plan.eligible_nodes) >= replicas,
        plan.tensor_parallel_size,
        len(plan.eligible_nodes),
        profile.cpus,
        profile.memory_bytes,
        sorted(plan.eligible_nodes),
    )


def node_rejection(spec: CpuLLMServiceSpec, node: NodeProfile) -> str | None:
    """Why a node cannot run this service at all (before sizing), or None."""
    if node.unschedulable:
        return "unschedulable (cordoned)"
    if spec.image is None and node.arch not in c.IMAGE_ARCH_SUFFIX:
        return f"arch {node.arch} has no default vLLM CPU image (set spec.image)"
    missing = sorted(set(spec.cpu.required_isa) - node.isa)
    if missing:
        return "lacks ISA " + ",".join(missing)
    for key, value in spec.node_selector.items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    if not _matches_required_node_affinity(spec.affinity, node):
        return "required node affinity does not match"
    for taint in node.taints:
        if taint.effect in ("NoSchedule", "NoExecute") and not any(_tolerates(t, taint) for t in spec.tolerations):
            return f"taint {taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect} not tolerated"
    return None


def _tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return toleration.key in (None, "", taint.key)
    return toleration.key == taint.key and (toleration.value or "") == (taint.value or "")


def _matches_required_node_affinity(affinity: Mapping[str, Any] | None, node: NodeProfile) -> bool:
    required = ((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = (required or {}).get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(_matches_term(term, node) for term in terms)


def _matches_term(term: Mapping[str, Any], node: NodeProfile) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node (Kubernetes semantics)
    labels_ok = all(_matches_expression(e, node.labels.get(e.get("key", ""))) for e in expressions)
    fields_ok = all(e.get("key") == "metadata.name" and _matches_expression(e, node.name) for e in fields)
    return labels_ok and fields_ok


def _matches_expression(expression: Mapping[str, Any], value: str | None) -> bool:
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and value.lstrip("-").isdigit() and values:
        bound = int(values[0])
        return int(value) > bound if operator == "Gt" else int(value) < bound
    return False


def _explicit_tensor_parallel_size(spec: CpuLLMServiceSpec) -> int | None:
    """spec.tensorParallelSize, or the rank count of an explicit thread binding list."""
    bind = spec.cpu.threads_bind
    ranks_in_bind = bind.count("|") + 1 if _is_explicit_bind(bind) else None
    tp = spec.tensor_parallel_size
    if tp is not None and ranks_in_bind is not None and tp != ranks_in_bind:
        raise InvalidTensorParallelSize(f"cpu.threadsBind lists {ranks_in_bind} ranks but tensorParallelSize is {tp}")
    return tp if tp is not None else ranks_in_bind


def _is_explicit_bind(bind: str) -> bool:
    return (
        bind not in (ThreadsBindMode.AUTO, ThreadsBindMode.NOBIND) and re.match(EXPLICIT_BIND_PATTERN, bind) is not None
    )


def tensor_parallel_problem(tp: int, model: ModelSize) -> str | None:
    """Why vLLM cannot run this TP for this model, or None."""
    if tp in c.UNSUPPORTED_TENSOR_PARALLEL_SIZES:
        return f"tensor parallel size {tp} is not supported by vLLM's CPU backend"
    if model.num_attention_heads % tp:
        return f"tensor parallel size {tp} does not divide the {model.num_attention_heads} attention heads"
    kv = model.num_kv_heads
    if kv % tp and tp % kv:
        return f"tensor parallel size {tp} neither divides nor is a multiple of the {kv} KV heads"
    return None


def _check_tensor_parallel_size(tp: int, model: ModelSize) -> None:
    problem = tensor_parallel_problem(tp, model)
    if problem:
        raise InvalidTensorParallelSize(problem)


def _auto_tensor_parallel_size(numa_nodes: int, model: ModelSize) -> int:
    return next(t for t in range(numa_nodes, 0, -1) if tensor_parallel_problem(t, model) is None)


@dataclass(frozen=True)
class MemoryBudget:
    """A pod's memory, part by part: server overhead + TP x (shard + KV + rank overhead) + /dev/shm."""

    tensor_parallel_size: int
    shard_bytes: int
    kv_bytes: int
    rank_overhead_bytes: int
    shm_bytes: int

    @property
    def per_rank_bytes(self) -> int:
        """What one rank needs on its NUMA node: its weight shard, its KV cache and its runtime."""
        return self.shard_bytes + self.kv_bytes + self.rank_overhead_bytes

    @property
    def limit_bytes(self) -> int:
        """The container's memory request and limit, rounded up to a whole MiB."""
        total = c.SERVER_OVERHEAD_BYTES + self.tensor_parallel_size * self.per_rank_bytes + self.shm_bytes
        return math.ceil(total / c.MiB) * c.MiB


def memory_budget(tp: int, shard_bytes: int, kv_gib: int) -> MemoryBudget:
    return MemoryBudget(
        tensor_parallel_size=tp,
        shard_bytes=shard_bytes,
        kv_bytes=kv_gib * c.GiB,
        rank_overhead_bytes=c.RANK_OVERHEAD_BASE_BYTES + math.ceil(shard_bytes * c.RANK_OVERHEAD_SHARD_FRACTION),
        shm_bytes=c.SHM_BASE_BYTES + tp * c.SHM_PER_RANK_BYTES,
    )


@dataclass(frozen=True)
class _Sizing:
    kv_gib: int
    kv_source: str
    kv_tokens_per_rank: int
    memory: MemoryBudget


def _size(spec: CpuLLMServiceSpec, model: ModelSize, tp: int) -> _Sizing:
    per_token = model.kv_bytes_per_token_per_rank(tp)
    if spec.kv_cache_gi_b is not None:
        kv_gib, source = spec.kv_cache_gi_b, "explicit"
    else:
        assert spec.max_model_len is not None and spec.max_num_seqs is not None  # spec validation
        kv_gib = max(1, math.ceil(spec.max_model_len * spec.max_num_seqs * per_token / c.GiB))
        source = "derived"
    tokens = kv_gib * c.GiB // per_token
    context = spec.max_model_len or model.max_position_embeddings
    if context is not None and tokens < context:
        need = math.ceil(context * per_token / c.GiB)
        raise KVCacheTooSmall(
            f"kvCacheGiB {kv_gib} holds {tokens} tokens per rank, less than one sequence of {context} "
            f"(max model length); set kvCacheGiB >= {need} or maxModelLen <= {tokens}"
        )
    return _Sizing(kv_gib, source, tokens, memory_budget(tp, math.ceil(model.weights_bytes / tp), kv_gib))


def _threads(spec: CpuLLMServiceSpec, node: NodeProfile, cpus_per_rank: int) -> tuple[str, int, int | None]:
    """(VLLM_CPU_OMP_THREADS_BIND, reserved CPUs per rank, OMP_NUM_THREADS or None)."""
    physical = max(1, cpus_per_rank // 2) if node.smt else cpus_per_rank
    reserved = spec.cpu.reserved_cpus_per_rank
    if reserved is None:
        reserved = 1 if physical > 2 else 0
    mode = spec.cpu.threads_bind
    if mode == ThreadsBindMode.AUTO and node.cpu_manager_policy == "none":
        # No exclusive cpuset: the container sees every host CPU; binding to all of them oversubscribes
        # the CFS quota. Run as many threads as the rank has cores instead.
        mode = ThreadsBindMode.NOBIND.value
    omp = max(1, physical - reserved) if mode == ThreadsBindMode.NOBIND else None
    return mode, reserved, omp


def _plan_for_shape(
    spec: CpuLLMServiceSpec, model: ModelSize, members: Sequence[NodeProfile], explicit_tp: int | None
) -> Plan:
    node = members[0]
    memory = min(n.memory_bytes for n in members)
    names = sorted(n.name for n in members)
    where = f"{node.arch}/{node.numa_nodes}-NUMA/{node.cpus}-CPU nodes ({name_list(names)})"

    tp = explicit_tp if explicit_tp is not None else _auto_tensor_parallel_size(node.numa_nodes, model)
    bind = spec.cpu.threads_bind
    if tp > node.numa_nodes and bind == ThreadsBindMode.AUTO and node.cpu_manager_policy != "none":
        raise InvalidTensorParallelSize(
            f"tensor parallel size {tp} exceeds the {node.numa_nodes} NUMA nodes of {where}; vLLM's 'auto' "
            "binding needs one NUMA node per rank (set cpu.threadsBind to nobind or an explicit list)"
        )
    cpus_per_rank = spec.cpu.cpus_per_rank or node.cpus // max(node.numa_nodes, tp)
    if cpus_per_rank < 1 or cpus_per_rank * tp > node.cpus:
        raise ModelTooLarge(f"{tp} ranks of {max(cpus_per_rank, 1)} CPUs do not fit the {node.cpus} CPUs of {where}")

    sizing = _size(spec, model, tp)
    budget = sizing.memory
    ranks_per_numa = math.ceil(tp / node.numa_nodes)
    per_numa_need = ranks_per_numa * budget.per_rank_bytes
    per_numa_have = memory // node.numa_nodes
    if per_numa_need > per_numa_have or budget.limit_bytes > memory:
        raise ModelTooLarge(
            f"needs {_gib(budget.limit_bytes)} GiB per pod ({_gib(per_numa_need)} GiB per NUMA node for "
            f"{ranks_per_numa} rank(s) of {_gib(budget.shard_bytes)} GiB weights + {sizing.kv_gib} GiB KV); "
            f"{where} have {_gib(memory)} GiB ({_gib(per_numa_have)} GiB per NUMA node)"
        )

    threads_bind, reserved, omp = _threads(spec, node, cpus_per_rank)
    launcher = spec.cpu.launcher and threads_bind == ThreadsBindMode.AUTO
    image = spec.image or f"{c.DEFAULT_IMAGE_REPOSITORY}:{c.VLLM_VERSION}-{c.IMAGE_ARCH_SUFFIX[node.arch]}"
    why_tp = "explicit" if explicit_tp is not None else f"one rank per NUMA node of {node.numa_nodes}"
    summary = (
        f"TP {tp} ({why_tp}), KV {sizing.kv_gib} GiB/rank ({sizing.kv_source}), "
        f"{'launcher' if launcher else threads_bind} binding, "
        f"{cpus_per_rank * tp} CPU, {_gib(budget.limit_bytes)} GiB on {len(names)} {where}"
    )
    return Plan(
        tensor_parallel_size=tp,
        kv_cache_gi_b=sizing.kv_gib,
        kv_cache_source=sizing.kv_source,
        kv_tokens_per_rank=sizing.kv_tokens_per_rank,
        threads_bind=threads_bind,
        launcher=launcher,
        reserved_cpus_per_rank=reserved,
        omp_num_threads=omp,
        cpus_per_rank=cpus_per_rank,
        cpu=cpus_per_rank * tp,
        weights_bytes=model.weights_bytes,
        weight_shard_bytes=budget.shard_bytes,
        kv_bytes_per_token=model.kv_bytes_per_token,
        rank_overhead_bytes=budget.rank_overhead_bytes,
        shm_bytes=budget.shm_bytes,
        memory_limit_bytes=budget.limit_bytes,
        max_model_len=spec.max_model_len,
        image=image,
        node_profile=NodeProfileSummary(
            arch=node.arch,
            numa_nodes=node.numa_nodes,
            numa_source=node.numa_source,
            cpus=node.cpus,
            memory_bytes=memory,
            smt=node.smt,
            cpu_manager_policy=node.cpu_manager_policy,
            isa=sorted(node.isa),
        ),
        eligible_nodes=names,
        summary=summary,
    )


def _gib(n: int) -> str:
    return f"{n / c.GiB:.1f}"
