"""The planner: (spec, model size, node profiles) -> Plan, or a typed PlanRefusal. Pure.

Eligible nodes (core/eligibility.py's chain of checks) are grouped by shape; each shape is planned with the least
memory among its nodes, by the placement strategy (core/placement/) that lays one pod out on it, and, with
`placement: auto`, by both where a server fits one NUMA node. Memory is checked weights first (ModelTooLarge), then
the KV cache against one sequence (KVCacheTooSmall), then the whole budget (core/memory.py); every plan says how fast
it serves (core/performance.py). Among the plans that fit, the one with room for every replica wins, then the shape
the service runs on, then the best prediction for spec.objective. When every shape was refused for one reason, that
reason is reported. docs/planning.md has the rules and their reasons.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from cpullm import vllm_support
from cpullm.api.plan import (
    FasterFormat,
    ModelSizing,
    NodeProfileSummary,
    NodeShape,
    Plan,
    PredictedSpeed,
    SpeculativePlan,
    binding_shown,
)
from cpullm.api.spec import (
    EXPLICIT_BIND_PATTERN,
    CpuLLMServiceSpec,
    EnvVar,
    KVCacheDType,
    Objective,
    Placement,
    RoutingMode,
    SpeculativeMethod,
    ThreadsBindMode,
)
from cpullm.core import constants as c
from cpullm.core.cautions import Ranks, plan_cautions
from cpullm.core.daemonsets import DaemonPods
from cpullm.core.eligibility import Needs, node_rejection
from cpullm.core.memo import Memo
from cpullm.core.memory import MemoryBudget, memory_budget, onednn_packs_embeddings, shm_size_bytes
from cpullm.core.node_selection import shape_node_terms
from cpullm.core.performance import Serving, faster_formats, kernel_of, predict, saturation_streams
from cpullm.core.placement import STRATEGIES, PlacementStrategy, PodLayout, Shape, strategy_for
from cpullm.core.placement.base import shapes_of
from cpullm.core.podsecurity import server_security
from cpullm.core.routing import drain_seconds, leave_router_room, routing_mode
from cpullm.core.sizing import KVLayout, ModelSize
from cpullm.core.sizing.quantization import AMX
from cpullm.core.speculation import Speculation, with_mtp
from cpullm.core.speculation import choose as choose_speculation
from cpullm.core.speculation import off as speculation_off
from cpullm.core.timing import expected_start_seconds, startup_seconds, step_timeout_seconds
from cpullm.core.topology import NUMA_COUNT_LABELS, NUMA_SOURCE_DEFAULT, NodeProfile
from cpullm.errors import (
    ContextTooLong,
    InvalidTensorParallelSize,
    KVCacheTooSmall,
    ModelTooLarge,
    NoEligibleNode,
    PlanRefusal,
    UnsupportedModel,
    name_list,
)


def plan_service(
    spec: CpuLLMServiceSpec,
    model: ModelSize,
    nodes: Sequence[NodeProfile],
    current: Mapping[str, Any] | None = None,
    daemons: Sequence[DaemonPods] = (),
    router_image: str = c.DEFAULT_ROUTER_IMAGE,
    vllm_images: Mapping[str, str] = {},
) -> Plan:
    """`current`: the plan the service runs (status.plan), so an equally good shape does not replace it;
    `daemons`: the DaemonSets whose pods' requests the eligible nodes leave room for; `router_image`: the
    operator's router image (settings.router_image), for a router whose spec names none; `vllm_images`: the
    operator's vLLM image per arch (settings.vllm_images), for servers whose spec names none. The same inputs
    again (a service reconciled for a pod's readiness, services of one spec) give the plan from SERVICE_PLANS."""
    running = running_shape(current)
    before = _planned_before(current, running)
    spec_key = spec.model_dump_json()
    images = tuple(sorted(vllm_images.items()))
    nodes_key = tuple(node.planning_key for node in nodes)
    daemons_key = tuple(daemon.planning_key for daemon in daemons)
    key = (spec_key, model, nodes_key, daemons_key, running, before, router_image, images)
    return SERVICE_PLANS.get(
        key, lambda: _plan_service(spec, model, nodes, running, before, spec_key, daemons, router_image, vllm_images)
    )


def _plan_service(
    spec: CpuLLMServiceSpec,
    model: ModelSize,
    nodes: Sequence[NodeProfile],
    running: NodeShape | None,
    before: _Before,
    spec_key: str,
    daemons: Sequence[DaemonPods],
    router_image: str,
    vllm_images: Mapping[str, str],
) -> Plan:
    explicit_tp = _explicit_tensor_parallel_size(spec)
    if explicit_tp is not None:
        problem = model.tensor_parallel_problem(explicit_tp)
        if problem:
            raise InvalidTensorParallelSize(problem)
    needs = Needs.of(spec, model)

    eligible: list[NodeProfile] = []
    rejections: dict[str, str] = {}
    for node in nodes:
        why = node_rejection(needs, node)
        if why is None:
            eligible.append(node)
        else:
            rejections[node.name] = why
    if not eligible:
        raise NoEligibleNode(rejections)

    plans: list[tuple[Plan, Shape, _Fitted]] = []
    refusals: list[tuple[Shape, PlanRefusal]] = []
    for shape in shapes_of(eligible, daemons):
        for strategy in _strategies(spec, model, shape, explicit_tp, vllm_images):
            try:
                plan, fitted = _plan_for_shape(
                    spec, model, shape, strategy, explicit_tp, router_image, vllm_images, before, spec_key
                )
            except PlanRefusal as refusal:
                refusals.append((shape, refusal))
                rejections.update(dict.fromkeys(shape.names, refusal.message))
                continue
            plans.append((plan, shape, fitted))
    if plans:
        # Counted from the best of the plans that hold every replica (the rule before it), where any does.
        holding = [p for p, _, _ in plans if p.capacity >= spec.replicas] or [p for p, _, _ in plans]
        best = _best_objective(holding, spec)
        plan, shape, fitted = max(plans, key=lambda candidate: _preference(candidate[0], spec, running, best))
        # The chosen shape's alone: a label signature per member node was the planner's costliest step when
        # worked out for every shape (~1/3 of its time at 1,000 nodes).
        terms = shape_node_terms(shape.members, spec.cpu.required_isa, _unfit_lookalikes(plan, shape, eligible))
        # Listed in the order a fresh plan lists them (the running shape aside), offline and in the operator alike.
        others = sorted(
            (p for p, _, _ in plans if p is not plan), key=lambda p: _preference(p, spec, None, best), reverse=True
        )
        passed_over = [
            f"{_describe(p)}: {_why_passed_over(plan, p, spec, running, best)}" for p in others[:PASSED_OVER_SHOWN]
        ]
        if len(others) > PASSED_OVER_SHOWN:
            passed_over.append(f"and {len(others) - PASSED_OVER_SHOWN} more node shapes")
        chosen: dict[str, Any] = {"node_selector_terms": terms, "passed_over": passed_over or None}
        if plan.predicted is not None:
            faster = _faster_formats(model, shape, fitted)
            chosen["predicted"] = plan.predicted.model_copy(update={"faster_formats": faster})
        return plan.model_copy(update=chosen)
    if len({type(refusal) for _, refusal in refusals}) == 1:
        # Every shape refused for the same reason: say that, for the shape that came closest (most memory).
        raise max(refusals, key=lambda item: (item[0].memory_bytes, item[0].node.cpus))[1]
    raise NoEligibleNode(rejections)


@dataclass(frozen=True)
class _Before:
    """What the running servers' plan chose that a new plan keeps rather than restart them for: speculation kept off
    (a plan made before the operator chose it, or one that kept it off for that reason, until the spec chooses),
    and the method and token count auto turned on."""

    keep_off: bool = False
    speculating: tuple[str, int] | None = None
    shape: NodeShape | None = None  # the node shape they run on

    def on(self, shape: NodeShape) -> _Before:
        """What a plan on `shape` keeps: nothing where the servers do not run on it (moving there restarts them
        anyway), so a shape passed over is weighed as a fresh plan would weigh it, offline and in the operator."""
        return self if shape == self.shape else _Before()


def _planned_before(current: Mapping[str, Any] | None, shape: NodeShape | None) -> _Before:
    """What the running servers' plan (`current`, on node shape `shape`) chose that a new plan keeps."""
    if current is None or "tensorParallelSize" not in current:
        return _Before()
    speculative = current.get("speculative")
    if not isinstance(speculative, Mapping):
        return _Before(keep_off=speculative is None, shape=shape)
    method, tokens = speculative.get("method"), speculative.get("tokens")
    speculating = (method, tokens) if isinstance(method, str) and isinstance(tokens, int) else None
    return _Before(keep_off=speculative.get("keptOff") is True, speculating=speculating, shape=shape)


def _unfit_lookalikes(plan: Plan, shape: Shape, eligible: Sequence[NodeProfile]) -> list[NodeProfile]:
    """Eligible nodes outside the chosen shape whose NUMA nodes cannot hold the plan's pods: another NUMA count,
    or a NUMA node with fewer CPUs than the ranks (or the server) it would take, as their NodeResourceTopology
    reports them. Labels may select them like the chosen nodes (core/node_selection.py excludes them by name);
    the scheduler's resource fit, which counts a node's CPUs, not a NUMA node's, would not keep the pods off.
    Without such reports, nodes labelled alike have the same NUMA count, and nothing is excluded."""
    if not any(node.numa_cpus for node in eligible):
        return []
    chosen, numa_nodes = set(shape.names), plan.node_profile.numa_nodes
    cpus_per_numa = plan.cpus_per_rank * math.ceil(plan.tensor_parallel_size / numa_nodes)

    def fits(node: NodeProfile) -> bool:
        return node.numa_nodes == numa_nodes and (not node.numa_cpus or min(node.numa_cpus) >= cpus_per_numa)

    return [node for node in eligible if node.name not in chosen and not fits(node)]


def running_shape(current: Mapping[str, Any] | None) -> NodeShape | None:
    """The node shape of the plan the service runs (status.plan.nodeProfile), None where there is none to read. A
    plan from an operator before numaCpus reads as none reported, which is what it meant."""
    try:
        return NodeProfileSummary.model_validate((current or {}).get("nodeProfile")).shape
    except ValidationError:
        return None


PASSED_OVER_SHOWN = 3  # node shapes named in plan.passedOver; the rest are counted


def _describe(plan: Plan) -> str:
    profile = plan.node_profile
    where = f"{profile.arch}/{profile.numa_nodes}-NUMA/{profile.cpus}-CPU nodes ({name_list(plan.eligible_nodes)})"
    return f"{plan.placement} TP {plan.tensor_parallel_size} on {where}"


def _why_passed_over(
    chosen: Plan, other: Plan, spec: CpuLLMServiceSpec, running: NodeShape | None, best: tuple[float, ...]
) -> str:
    """The rule of _preference the chosen plan beat `other` on, in words: the first that tells them apart of those
    about the plans themselves; the shape the service already runs on only where it alone decided (so a plan reads
    the same offline as in the operator)."""
    won, lost = _preference(chosen, spec, running, best), _preference(other, spec, running, best)
    reasons = (
        f"they hold {other.capacity} of the {spec.replicas} replicas",
        "the service runs on the chosen shape already (moving it would restart its servers)",
        f"predicted {_objective_shown(other, spec)} there, {_objective_shown(chosen, spec)} for the chosen plan "
        f"(objective {spec.objective.value})",
        f"they hold {other.capacity} pod{'s' if other.capacity != 1 else ''}, the chosen nodes {chosen.capacity}",
        f"TP {other.tensor_parallel_size} there, {chosen.tensor_parallel_size} on the chosen nodes",
        f"{other.node_profile.cpus} CPUs each, against {chosen.node_profile.cpus}",
        "less memory",
        "they fit as well; the chosen nodes come first by name",
    )
    running_rule = 1
    for rule, (a, b) in enumerate(zip(won, lost, strict=True)):
        if rule == running_rule or a == b:
            continue
        return reasons[rule] if a > b else reasons[running_rule]  # type: ignore[operator]
    return reasons[running_rule] if won[running_rule] != lost[running_rule] else reasons[-1]


def _objective_shown(plan: Plan, spec: CpuLLMServiceSpec) -> str:
    p = plan.predicted
    if p is None:
        return "nothing"
    if spec.objective == Objective.LATENCY:
        first = p.time_to_first_token_seconds
        return f"{p.decode_tokens_per_second:.1f} tok/s for one sequence, a first token in {first:.2f} s"
    return f"{p.throughput_tokens_per_second / plan.cpu:.2f} tok/s per CPU at {p.throughput_streams} sequences"


def _objective_values(plan: Plan, spec: CpuLLMServiceSpec) -> tuple[float, ...]:
    """What spec.objective asks of a plan's prediction, each higher-is-better: throughput per CPU; or one sequence's
    decode, then the first token's rate (1 / its seconds). Zero where nothing is predicted."""
    p = plan.predicted
    if spec.objective == Objective.LATENCY:
        return (p.decode_tokens_per_second, 1 / p.time_to_first_token_seconds) if p else (0.0, 0.0)
    return (p.throughput_tokens_per_second / plan.cpu,) if p else (0.0,)


def _best_objective(plans: list[Plan], spec: CpuLLMServiceSpec) -> tuple[float, ...]:
    """The best of each of the plans' objective values: what a plan's steps are counted down from."""
    return tuple(max(values) for values in zip(*(_objective_values(p, spec) for p in plans), strict=True))


def _objective(plan: Plan, spec: CpuLLMServiceSpec, best: tuple[float, ...]) -> tuple[int, ...]:
    """How well a plan meets spec.objective, in steps of OBJECTIVE_STEP below the best plan's (each value in turn):
    every plan within a step of the best ties with it, and the rules after it decide. Counted from the best, not
    from fixed boundaries, so two plans a hair apart never fall either side of one."""
    return tuple(-_steps_below(top, value) for value, top in zip(_objective_values(plan, spec), best, strict=True))


# Predictions this close are a tie: the estimates are not finer, and the probes move by as much between runs.
OBJECTIVE_STEP = 1.1


def _steps_below(best: float, value: float) -> int:
    if value <= 0:
        return 10**6  # nothing predicted: below every prediction
    return math.floor(math.log(max(best, value) / value) / math.log(OBJECTIVE_STEP))


def _preference(
    plan: Plan, spec: CpuLLMServiceSpec, running: NodeShape | None, best: tuple[float, ...]
) -> tuple[object, ...]:
    profile = plan.node_profile
    return (
        plan.capacity >= spec.replicas,
        # The shape the service runs on stays while it is good enough: nodes joining the pool must not move
        # running servers to an equally good shape (each move restarts them, minutes on CPU).
        profile.shape == running,
        _objective(plan, spec, best),
        plan.capacity,
        plan.tensor_parallel_size,
        profile.cpus,
        profile.memory_bytes,
        sorted(plan.eligible_nodes),
    )


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


def _check_fits(budget: MemoryBudget, layout: PodLayout, where: str, what: str) -> None:
    per_numa_need = layout.ranks_per_numa * budget.per_rank_bytes
    if per_numa_need > layout.numa_memory_bytes or budget.limit_bytes > layout.pod_memory_bytes:
        ranks = f"{layout.ranks_per_numa} rank(s) of {_gib(budget.shard_bytes)} GiB weights"
        kv = f" + {_gib(budget.kv_bytes)} GiB KV" if budget.kv_bytes else ""
        remedy = (
            "a smaller kvCacheGiB (or maxModelLen, maxNumSeqs), kvCacheDtype fp8, a quantized checkpoint, or nodes "
            "with more memory"
            if budget.kv_bytes
            else "a quantized checkpoint (AWQ, GPTQ), or nodes with more memory per NUMA node"
        )
        raise ModelTooLarge(
            f"{what} {_gib(budget.limit_bytes)} GiB per pod ({_gib(per_numa_need)} GiB per NUMA node for {ranks}{kv}); "
            f"{where} have {_gib(layout.pod_memory_bytes)} GiB ({_gib(layout.numa_memory_bytes)} GiB per NUMA node); "
            f"try {remedy}"
        )


@dataclass(frozen=True)
class _KVCache:
    gib: int
    source: str  # explicit | derived | default
    tokens_per_rank: int
    max_model_len: int | None
    max_model_len_source: str  # spec | model | kv-cache | default
    layout: KVLayout
    max_num_seqs: int | None = None  # rendered as --max-num-seqs
    max_num_seqs_source: str = "vllm"  # spec | default | vllm (not rendered: vLLM's own)


def kv_element_bytes(spec: CpuLLMServiceSpec, model: ModelSize) -> int:
    if spec.kv_cache_dtype != KVCacheDType.FP8:
        return model.dtype_bytes
    if model.uses_mla:
        raise UnsupportedModel("kvCacheDtype fp8 is not supported by vLLM CPU for MLA models; use auto")
    return 1


def _kv_cache(spec: CpuLLMServiceSpec, model: ModelSize, tp: int, isa: frozenset[str]) -> _KVCache:
    layout = model.kv(kv_element_bytes(spec, model), isa)
    model_max = model.max_position_embeddings
    if spec.max_model_len is not None and model_max is not None and spec.max_model_len > model_max:
        raise ContextTooLong(
            f"maxModelLen {spec.max_model_len} is longer than the model's context of {model_max} tokens "
            "(max_position_embeddings); lower it"
        )
    seqs, seqs_source = spec.max_num_seqs, "spec" if spec.max_num_seqs is not None else "vllm"
    context: int | None = spec.max_model_len
    context_source = "spec" if context is not None else "model"
    if spec.kv_cache_gi_b is not None:
        kv_gib, source = spec.kv_cache_gi_b, "explicit"
        context = context if context is not None else model_max
    else:
        # Sized from maxModelLen x maxNumSeqs; what the spec leaves open is a chosen default (constants.py).
        if context is None:
            context, context_source = min(model_max or c.DEFAULT_MAX_MODEL_LEN, c.DEFAULT_MAX_MODEL_LEN), "default"
        if seqs is None:
            seqs, seqs_source = c.DEFAULT_MAX_NUM_SEQS, "default"
        need = seqs * layout.sequence_bytes(tp, context)
        kv_gib = max(1, math.ceil(need / c.GiB))
        source = "derived" if "default" not in (context_source, seqs_source) else "default"
    kv_bytes = kv_gib * c.GiB
    rendered = context if context_source in ("spec", "default") else None
    if context is None or layout.sequence_bytes(tp, context) <= kv_bytes:
        tokens = layout.tokens(kv_bytes, tp, context)
        return _KVCache(kv_gib, source, tokens, rendered, context_source, layout, seqs, seqs_source)
    capped = layout.longest_context(kv_bytes, tp, context) // c.KV_BLOCK_TOKENS * c.KV_BLOCK_TOKENS
    if context_source == "model" and capped > 0:
        # The user left the context length open: serve the longest context the KV cache holds.
        tokens = layout.tokens(kv_bytes, tp, capped)
        return _KVCache(kv_gib, source, tokens, capped, "kv-cache", layout, seqs, seqs_source)
    need_gib = math.ceil(layout.sequence_bytes(tp, context) / c.GiB)
    holds = layout.longest_context(kv_bytes, tp, context)
    raise KVCacheTooSmall(
        f"kvCacheGiB {kv_gib} holds {holds} tokens per rank, less than one sequence of {context} "
        f"(max model length); set kvCacheGiB >= {need_gib} or maxModelLen <= {holds}"
    )


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


def _rank_threads(node: NodeProfile, cpus_per_rank: int, reserved: int, omp: int | None) -> int:
    """The OpenMP threads each rank runs: one per physical core the launcher binds (less those reserved), or
    OMP_NUM_THREADS with nobind."""
    if omp is not None:
        return omp
    physical = max(1, cpus_per_rank // 2) if node.smt else cpus_per_rank
    return max(1, physical - reserved)


def _predicted(model: ModelSize, shape: Shape, fitted: _Fitted, speculation: Speculation) -> PredictedSpeed:
    """How fast one server of the plan serves (core/performance.py), with speculative decoding where the plan turns
    it on, at its maxNumSeqs for throughput, and what a million tokens cost where the nodes carry a price (the
    server's share of a node: its CPUs or its memory limit)."""
    serving, streams, kv_bytes = fitted.serving, fitted.streams, fitted.kv_bytes_per_token
    cpu, memory_bytes = fitted.layout.cpus_per_rank * serving.tensor_parallel_size, fitted.budget.limit_bytes
    figures = predict(model, serving, shape.performance, streams, kv_bytes)
    if speculation.method is not None and speculation.decode_gain and speculation.throughput_gain:
        figures = dataclasses.replace(
            figures,
            decode_tokens_per_second=figures.decode_tokens_per_second * speculation.decode_gain,
            throughput_tokens_per_second=figures.throughput_tokens_per_second * speculation.throughput_gain,
        )
    cost = None
    if shape.price_per_hour is not None and figures.throughput_tokens_per_second > 0:
        share = max(cpu / max(shape.node.cpus, 1), memory_bytes / max(shape.memory_bytes, 1))
        tokens_per_hour = figures.throughput_tokens_per_second * 3600
        cost = round(shape.price_per_hour * min(share, 1.0) / tokens_per_hour * 1e6, 4)
    return PredictedSpeed(
        decode_tokens_per_second=round(figures.decode_tokens_per_second, 2),
        throughput_tokens_per_second=round(figures.throughput_tokens_per_second, 1),
        throughput_streams=figures.throughput_streams,
        time_to_first_token_seconds=round(figures.time_to_first_token_seconds, 2),
        prompt_tokens=figures.prompt_tokens,
        saturation_streams=saturation_streams(model, serving, shape.performance, streams, kv_bytes),
        basis=figures.basis,
        source=figures.source,
        cost_per_million_tokens=cost,
    )


def _faster_formats(model: ModelSize, shape: Shape, fitted: _Fitted) -> list[FasterFormat] | None:
    """The checkpoints predicted much faster than the model's own on the chosen plan's servers: worked out for the
    chosen plan alone (three predictions each, they were half the planner's time when made for every shape)."""
    found = faster_formats(
        model, fitted.serving, shape.performance, fitted.streams, shape.node.isa, fitted.kv_bytes_per_token
    )
    return [
        FasterFormat(checkpoint=f.checkpoint, decode_speedup=f.decode_speedup, throughput_speedup=f.throughput_speedup)
        for f in found
    ] or None


@dataclass(frozen=True)
class _Server:
    """The vLLM a plan renders for: its image, the version it is (None: unknown) and how that was told, and the
    in-pod fixes that apply to that version (cpullm/vllm_support.py): the memory they save is credited only then."""

    image: str
    version: str | None
    version_source: str  # spec | image tag | unknown
    fixes: frozenset[str]


def server_image(spec: CpuLLMServiceSpec, arch: str, vllm_images: Mapping[str, str]) -> str:
    """The vLLM image of a server on `arch`: the spec's, else the operator's for that arch, else vLLM's published."""
    return spec.image or vllm_images.get(arch) or _published_image(arch)


def _server(spec: CpuLLMServiceSpec, arch: str, vllm_images: Mapping[str, str]) -> _Server:
    image = server_image(spec, arch, vllm_images)
    tag = image.split("@", 1)[0].rpartition("/")[2].partition(":")[2]
    if spec.vllm_version is not None:
        version, source = spec.vllm_version, "spec"
    elif (key := vllm_support.version_key(tag)) is not None:
        version, source = ".".join(map(str, key)), "image tag"
    else:
        version, source = None, "unknown"
    return _Server(image, version, source, vllm_support.fixes_for(version))


def _one_server_fits_a_numa_node(
    spec: CpuLLMServiceSpec, model: ModelSize, shape: Shape, fixes: frozenset[str]
) -> bool:
    """The `auto` placement rule: does one TP=1 server (weights, KV cache, runtime, server processes and
    /dev/shm) fit one NUMA node's memory?"""
    try:
        kv = _kv_cache(spec, model, 1, shape.node.isa)
    except KVCacheTooSmall:
        return False
    processes = _server_processes(spec, 1, shape.node.arch, fixes)
    budget = memory_budget(
        model, 1, model.weights_bytes, kv.gib, spec.adapters, **processes, **_kernels(spec, shape.node)
    )
    return budget.limit_bytes <= shape.numa_memory_bytes


def _rank_in_engine_core(spec: CpuLLMServiceSpec, tp: int, fixes: frozenset[str]) -> bool:
    """Does a server of `tp` ranks run its rank in vLLM's engine core process (the launcher's fix,
    cpullm/vllm_fixes.py)? Only with one rank, the launcher and a vLLM the fix is for, unless spec.env turns the fix
    off or asks for vLLM's multiprocess executor."""
    fix = vllm_support.RANK_IN_ENGINE_CORE
    if not spec.cpu.launcher or tp != 1 or fix not in fixes or _turned_off(spec, fix):
        return False
    executor = _env_entry(spec, vllm_support.MULTIPROCESSING_ENV)
    return executor is None or executor.value == "0"


def _server_processes(spec: CpuLLMServiceSpec, tp: int, arch: str, fixes: frozenset[str]) -> dict[str, bool]:
    """Where the launcher's fix 3 runs a server's rank (vllm_fixes.rank_in_engine_core), as memory_budget's and
    Plan's fields: in the engine core, and that engine core forked from the API server (vllm_fixes.engine_core_forked)
    unless spec.env turns the fork off, where the image's OpenMP runtime is Intel's: the one the rendered LD_PRELOAD
    of the node's arch loads."""
    in_engine_core = _rank_in_engine_core(spec, tp, fixes)
    forked = (
        in_engine_core
        and vllm_support.INTEL_OPENMP in c.LD_PRELOAD_BY_ARCH.get(arch, "")
        and vllm_support.ENGINE_CORE_FORKED in fixes
        and not _turned_off(spec, vllm_support.ENGINE_CORE_FORKED)
    )
    return {"rank_in_engine_core": in_engine_core, "engine_core_forked": forked}


def _aot_compile_cache(spec: CpuLLMServiceSpec, fixes: frozenset[str]) -> bool:
    """Is vLLM's AOT compile cache on? Where a new pod finds what an earlier one saved (a claim, the node's
    directory): it makes a later start faster and the first slower (Qwen2.5-1.5B on two CPUs: second start 58 -> 48
    s, first 134 -> 159 s, docs/startup.md), and every pod on a pod-local emptyDir starts first. Only where the
    launcher's fix lets vLLM load it (vllm_fixes.aot_cache_loads) and spec.env does not turn that fix off: without
    it every start would compile and save again."""
    kept = spec.model_cache is not None and spec.model_cache.kept_across_pods
    fix = vllm_support.AOT_CACHE_LOADS
    return kept and spec.cpu.launcher and fix in fixes and not _turned_off(spec, fix)


def _credited_fixes(
    spec: CpuLLMServiceSpec,
    fixes: frozenset[str],
    processes: dict[str, bool],
    aot_compile_cache: bool,
    isa: frozenset[str],
) -> list[str]:
    """The fixes the plan counts on: those for this vLLM that spec.env leaves on, and of the ones a plan may not use,
    those it does (the rank in the engine core, its fork, the AOT cache; AMX tiles' permission where the nodes have
    them, without which vLLM's attention dies); never the container's CPU metrics, which no figure counts on. A
    server whose report says one of them did not load runs outside its plan (core/server_exits.py)."""
    used_only_when = {
        vllm_support.RANK_IN_ENGINE_CORE: processes["rank_in_engine_core"],
        vllm_support.ENGINE_CORE_FORKED: processes["engine_core_forked"],
        vllm_support.AOT_CACHE_LOADS: aot_compile_cache,
        vllm_support.AMX_TILE_PERMISSION: AMX in isa,
        vllm_support.CONTAINER_CPU_METRICS: False,  # the performance check's figures, not the plan's
    }
    if not spec.cpu.launcher:
        return []
    return sorted(f for f in fixes if not _turned_off(spec, f) and used_only_when.get(f, True))


def _kernels(spec: CpuLLMServiceSpec, node: NodeProfile) -> dict[str, bool]:
    """What vLLM's CPU kernels keep on this node beside the weights, as memory_budget's fields."""
    return {"embeddings_packed": onednn_packs_embeddings(node.arch, node.isa, spec.model.dtype)}


def _turned_off(spec: CpuLLMServiceSpec, fix: str) -> bool:
    """Does spec.env turn a fix to vLLM off? A value from a reference (valueFrom) is not known here, so it counts as
    off: the plan then counts what vLLM does without the fix."""
    off = _env_entry(spec, vllm_support.OFF_ENV)
    return off is not None and (off.value is None or fix in vllm_support.names_turned_off(off.value))


def _env_entry(spec: CpuLLMServiceSpec, name: str) -> EnvVar | None:
    return next((entry for entry in spec.env if entry.name == name), None)


def _placement_note(strategy: PlacementStrategy, shape: Shape, replicas: int, capacity: int) -> str | None:
    notes = []
    if shape.node.numa_source == NUMA_SOURCE_DEFAULT:
        notes.append(
            f"NUMA count unknown: 1 assumed (no {' or '.join(NUMA_COUNT_LABELS)} label on the nodes; install "
            "Node Feature Discovery or label them)"
        )
    takers = shape.room.takers
    if takers:
        shown = ", ".join(takers[:3]) + (f" and {len(takers) - 3} more" if len(takers) > 3 else "")
        notes.append(f"CPU and memory left on the nodes for: {shown}")
    notes += strategy.notes(shape, replicas, capacity)
    return "; ".join(notes) or None


def _strategies(
    spec: CpuLLMServiceSpec, model: ModelSize, shape: Shape, explicit_tp: int | None, vllm_images: Mapping[str, str]
) -> list[PlacementStrategy]:
    """The placements to plan on a shape: spec.placement's; with auto, where one TP=1 server fits a NUMA node of a
    node of several, both a server per NUMA node and one TP server per node, chosen between by spec.objective."""
    fits = _one_server_fits_a_numa_node(spec, model, shape, _server(spec, shape.node.arch, vllm_images).fixes)
    chosen = strategy_for(spec, fits, explicit_tp)
    if spec.placement == Placement.AUTO and chosen.name == Placement.THROUGHPUT and shape.node.numa_nodes > 1:
        return [chosen, STRATEGIES[Placement.TENSOR_PARALLEL]]
    return [chosen]


@dataclass(frozen=True)
class _Fitted:
    """A pod of the plan laid out on a shape, its memory checked: what the rest of the plan is made from."""

    layout: PodLayout
    shard: int
    processes: dict[str, bool]
    kv: _KVCache
    budget: MemoryBudget
    threads_bind: str
    reserved: int
    omp: int | None
    serving: Serving

    @property
    def streams(self) -> int:
        """The sequences a server runs at once: what its throughput is predicted at."""
        return self.kv.max_num_seqs or c.DEFAULT_MAX_NUM_SEQS

    @property
    def kv_bytes_per_token(self) -> int:
        """A rank's KV cache bytes per token."""
        return self.kv.layout.bytes_per_token(self.layout.tensor_parallel_size)


def _fitted(
    spec: CpuLLMServiceSpec,
    model: ModelSize,
    shape: Shape,
    strategy: PlacementStrategy,
    explicit_tp: int | None,
    server: _Server,
) -> _Fitted:
    """Lay one pod out and check its memory: weights first (ModelTooLarge), then the KV cache, then the whole."""
    node, where = shape.node, shape.describe()
    layout = strategy.layout(spec, model, shape, explicit_tp)
    tp = layout.tensor_parallel_size
    shard = math.ceil(model.weights_bytes / tp)
    processes, kernels = _server_processes(spec, tp, node.arch, server.fixes), _kernels(spec, node)
    _check_fits(
        memory_budget(model, tp, shard, 0, spec.adapters, **processes, **kernels),
        layout,
        where,
        "the weights alone need",
    )
    kv = _kv_cache(spec, model, tp, node.isa)
    budget = memory_budget(model, tp, shard, kv.gib, spec.adapters, **processes, **kernels)
    _check_fits(budget, layout, where, "needs")
    threads_bind, reserved, omp = _threads(spec, node, layout.cpus_per_rank)
    threads = _rank_threads(node, layout.cpus_per_rank, reserved, omp)
    serving = Serving(tp, threads, *kernel_of(model), lora=bool(spec.adapters), shares_cores=reserved == 0)
    return _Fitted(layout, shard, processes, kv, budget, threads_bind, reserved, omp, serving)


def _speculation(
    spec: CpuLLMServiceSpec, model: ModelSize, shape: Shape, fitted: _Fitted, version: str | None, before: _Before
) -> Speculation:
    """spec.speculative for this pod (core/speculation.py). `before.keep_off`: the running servers were planned by
    an operator that did not choose speculation, so auto keeps it off rather than restart them for it;
    `before.speculating`: what auto chose for them, kept while predicted about as good."""
    if before.keep_off and spec.speculative.method == SpeculativeMethod.AUTO:
        return dataclasses.replace(
            speculation_off(
                "auto: kept off, as the running servers were planned before the operator chose speculation (set "
                "spec.speculative.method to choose)"
            ),
            kept_off=True,
        )
    return choose_speculation(
        spec.speculative,
        spec.objective,
        model,
        fitted.serving,
        shape.performance,
        fitted.streams,
        fitted.kv_bytes_per_token,
        version,
        before.speculating,
    )


# The plans of recent (spec, model, shape, ...) inputs: a service reconciled again (a pod's readiness, a resync) and
# services of one spec on the same nodes plan each shape once. Measured in bench/scale_bench.py (100 services, 36
# node shapes): each shape's plan took ~1 ms, the whole planner ~32 ms a reconcile.
SHAPE_PLANS: Memo[Hashable, tuple[Plan, _Fitted]] = Memo(size=4096)
# Whole plans by their inputs: a reconcile's plan of an unchanged service on unchanged nodes is one lookup (the same
# bench: ~7 ms a reconcile with every shape from SHAPE_PLANS, most of it the strategies' fit and the keys' hashing).
SERVICE_PLANS: Memo[Hashable, Plan] = Memo(size=1024)


def forget_plans() -> None:
    """Empty both memos: a test that changes a constant the planner reads plans afresh under its value."""
    SHAPE_PLANS.clear()
    SERVICE_PLANS.clear()


def _plan_for_shape(
    spec: CpuLLMServiceSpec,
    model: ModelSize,
    shape: Shape,
    strategy: PlacementStrategy,
    explicit_tp: int | None,
    default_router_image: str,
    vllm_images: Mapping[str, str],
    before: _Before,
    spec_key: str,
) -> tuple[Plan, _Fitted]:
    """The plan on `shape`, from SHAPE_PLANS where it holds one made of the same inputs (`spec_key`: the spec's JSON):
    the shape after the router's room, and what the running servers keep on it."""
    routing, router_cpu, router_image = routing_mode(spec, strategy), None, None
    if routing == RoutingMode.ROUTER:  # each node leaves the router room: it never takes a server's CPUs
        shape, router_cpu = leave_router_room(spec, shape)
        router_image = spec.routing.router.image or default_router_image
    kept = before.on(shape.node.shape)

    def make() -> tuple[Plan, _Fitted]:
        return _planned(spec, model, shape, strategy, explicit_tp, vllm_images, kept, routing, router_cpu, router_image)

    images = tuple(sorted(vllm_images.items()))
    # What a node profile's equality leaves out (its measured speed, price and labels) is the plan's input too.
    facts = tuple(n.planning_key for n in shape.members)
    key = (spec_key, model, shape, facts, strategy, explicit_tp, images, kept, router_cpu, router_image)
    return SHAPE_PLANS.get(key, make)


def _planned(
    spec: CpuLLMServiceSpec,
    model: ModelSize,
    shape: Shape,
    strategy: PlacementStrategy,
    explicit_tp: int | None,
    vllm_images: Mapping[str, str],
    kept: _Before,
    routing: RoutingMode,
    router_cpu: int | None,
    router_image: str | None,
) -> tuple[Plan, _Fitted]:
    server = _server(spec, shape.node.arch, vllm_images)
    node, where = shape.node, shape.describe()
    fitted = _fitted(spec, model, shape, strategy, explicit_tp, server)
    speculation = _speculation(spec, model, shape, fitted, server.version, kept)
    if speculation.mtp_bytes:  # the MTP layers are loaded and cache too: the pod is laid out with them
        fitted = _fitted(spec, with_mtp(model), shape, strategy, explicit_tp, server)
    layout, kv, budget, processes = fitted.layout, fitted.kv, fitted.budget, fitted.processes
    tp, shard, reserved, omp, threads_bind = (
        layout.tensor_parallel_size,
        fitted.shard,
        fitted.reserved,
        fitted.omp,
        fitted.threads_bind,
    )
    aot_compile_cache = _aot_compile_cache(spec, server.fixes)
    capacity = layout.pods_per_node * len(shape.members)
    replicas = strategy.replicas(spec.replicas, capacity)
    predicted = _predicted(model, shape, fitted, speculation)
    binding = binding_shown(spec.cpu.launcher, threads_bind)
    context = f", context {kv.max_model_len} (what the KV cache holds)" if kv.max_model_len_source == "kv-cache" else ""
    kv_source = kv.source
    if kv.source == "default":
        kv_source = f"default: {kv.max_num_seqs} sequences x {kv.max_model_len} tokens"
    summary = (
        f"{strategy.name}: TP {tp} ({layout.why}), KV {kv.gib} GiB/rank ({kv_source}){context}, "
        f"{binding} binding, {layout.cpus_per_rank * tp} CPU, "
        f"{_gib(budget.limit_bytes)} GiB on {len(shape.members)} {where}"
    )
    plan = Plan(
        placement=strategy.name,
        replicas=replicas,
        capacity=capacity,
        placement_note=_placement_note(strategy, shape, spec.replicas, capacity),
        cautions=plan_cautions(
            spec,
            node,
            Ranks(
                where,
                tp,
                layout.cpus_per_rank,
                layout.pods_per_node > 1,
                server.image,
                server.version,
                model.quantization.describe() if model.quantization else None,
            ),
        )
        or None,
        tensor_parallel_size=tp,
        kv_cache_gi_b=kv.gib,
        kv_cache_source=kv.source,
        kv_tokens_per_rank=kv.tokens_per_rank,
        threads_bind=threads_bind,
        launcher=spec.cpu.launcher,
        security=server_security(spec),  # as a namespace enforcing no Pod Security level admits it (decision.py)
        **processes,
        aot_compile_cache=aot_compile_cache,
        vllm_version=server.version,
        vllm_version_source=server.version_source,
        fixes_credited=_credited_fixes(spec, server.fixes, processes, aot_compile_cache, node.isa),
        reserved_cpus_per_rank=reserved,
        omp_num_threads=omp,
        cpus_per_rank=layout.cpus_per_rank,
        cpu=layout.cpus_per_rank * tp,
        weights_bytes=model.weights_bytes,
        weight_shard_bytes=shard,
        kv_bytes_per_token=kv.layout.bytes_per_token(1),
        rank_overhead_bytes=budget.rank_runtime_bytes,
        packed_embeddings_bytes=budget.packed_embeddings_bytes,
        adapter_bytes=budget.adapter_bytes,
        server_overhead_bytes=budget.server_bytes,
        page_cache_bytes=budget.page_cache_bytes,
        shm_bytes=shm_size_bytes(tp),
        memory_limit_bytes=budget.limit_bytes,
        max_model_len=kv.max_model_len,
        max_model_len_source=kv.max_model_len_source,
        max_num_seqs=kv.max_num_seqs,
        max_num_seqs_source=kv.max_num_seqs_source,
        routing=routing.value,
        router_cpu_millis=router_cpu,
        router_image=router_image,
        drain_seconds=drain_seconds(spec, kv.max_model_len, shard),
        step_timeout_seconds=step_timeout_seconds(model, layout.cpus_per_rank),
        startup_seconds=startup_seconds(model, layout.cpus_per_rank, model.weights_bytes),
        expected_start_seconds=expected_start_seconds(model.weights_bytes),
        image=server.image,
        sizing=_sizing(spec, model, kv),
        predicted=predicted,
        speculative=SpeculativePlan(
            method=speculation.method or "off",
            tokens=speculation.tokens or None,
            vllm_config=speculation.vllm_config(),
            decode_gain=speculation.decode_gain,
            throughput_gain=speculation.throughput_gain,
            weights_bytes=speculation.mtp_bytes or None,
            kept_off=speculation.kept_off or None,
            reason=speculation.reason,
        ),
        node_profile=node.summary(shape.memory_bytes),
        eligible_nodes=shape.names,
        summary=summary,
    )
    return plan, fitted


def _published_image(arch: str) -> str:
    """vLLM's published CPU image of the operator's vLLM version for `arch`: without spec.image, only the arches it
    is published for are eligible (core/eligibility.py)."""
    return f"{c.DEFAULT_IMAGE_REPOSITORY}:{c.VLLM_VERSION}-{c.IMAGE_ARCH_SUFFIX[arch]}"


def _sizing(spec: CpuLLMServiceSpec, model: ModelSize, kv: _KVCache) -> ModelSizing:
    anatomy = model.anatomy
    context = kv.max_model_len or model.max_position_embeddings or 0
    return ModelSizing(
        family=anatomy.family,
        parameters=model.parameters,
        experts=f"{anatomy.experts} experts, {anatomy.active_experts} active" if anatomy.experts else None,
        weights_source=model.weights_source,
        quantization=model.quantization.describe() if model.quantization else None,
        kv_layout=kv.layout.describe(),
        kv_cache_dtype=spec.kv_cache_dtype.value,
        kv_window_bytes_per_sequence=kv.layout.window_bytes(1, context),
        notes=list(anatomy.notes),
    )


def _gib(n: int) -> str:
    return f"{n / c.GiB:.1f}"
