"""What a plan runs but runs slower than the nodes or the model allow: a rank whose CPUs span NUMA nodes, bfloat16
on cores without bf16 arithmetic, a vLLM whose version the operator does not know (no fix credited). Each is
reported in status.plan.cautions and as a condition of its own, present
(False, with a Warning event) only while it holds, so the service is served and its owner told why it is slow and
what to change. A new caution is one more entry in CAUTIONS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cpullm.api.plan import PlanCaution
from cpullm.api.spec import CpuLLMServiceSpec, DType
from cpullm.core.topology import NodeProfile
from cpullm.vllm_support import RELEASES

# The CPU flags (lscpu names) of bf16 arithmetic, per arch.
BF16_FLAGS = {"amd64": ("avx512_bf16", "amx_bf16"), "arm64": ("bf16",)}


@dataclass(frozen=True)
class Ranks:
    """What the plan renders on the chosen nodes (`where`, as the plan names them): the ranks' count and CPUs each,
    and the vLLM image and its version (None: unknown)."""

    where: str
    tensor_parallel_size: int
    cpus_per_rank: int
    one_per_numa_node: bool  # several servers per node, each on a NUMA node of its own (throughput placement)
    image: str = ""
    vllm_version: str | None = None
    checkpoint: str | None = None  # the checkpoint's quantization (None: unquantized weights)


def _rank_spans_numa_nodes(spec: CpuLLMServiceSpec, node: NodeProfile, ranks: Ranks) -> str | None:
    per_numa = node.cpus_per_numa_node
    if node.numa_nodes < 2 or ranks.one_per_numa_node:
        return None
    too_big = ranks.cpus_per_rank > per_numa
    straddles = ranks.tensor_parallel_size > node.numa_nodes and per_numa % ranks.cpus_per_rank != 0
    if not (too_big or straddles):
        return None
    why = (
        f"each rank's {ranks.cpus_per_rank} CPUs are more than a NUMA node has ({per_numa})"
        if too_big
        else f"{ranks.tensor_parallel_size} ranks of {ranks.cpus_per_rank} CPUs do not divide NUMA nodes of {per_numa}"
    )
    return (
        f"{why}: a rank's threads and memory cross NUMA nodes of {ranks.where}, where memory reads are slower; set "
        f"cpu.cpusPerRank to at most {per_numa} (or a divisor of it), or tensorParallelSize {node.numa_nodes} for "
        "one rank per NUMA node"
    )


@dataclass(frozen=True)
class DecodeSpeed:
    """One measured fact: one sequence's decode with a checkpoint format of a model, against the same model in bf16,
    on cores with or without bf16 arithmetic (docs/benchmarks.md shows the table and the runs it came from)."""

    native_bf16: bool  # the cores multiply bf16 natively (avx512_bf16, amx_bf16; arm64's bf16)
    cores_with: str  # the CPU flag the measured cores have (the fact is claimed only for nodes that have it too)
    checkpoint: str  # the format, as a user names it
    vs_bf16: float  # its decode tok/s over bf16's, same model shape, same CPUs
    measured: str  # where and how


# bench/engines_bench.py, 2026-11-28: Qwen2.5-1.5B's shape (random weights) on 2 AMD EPYC cores with avx512_bf16 and
# VNNI, no AMX, vLLM 0.32.0; one sequence's decode tok/s, the format's over bf16's in the same run. The cores without
# bf16 arithmetic are emulated there: oneDNN held to AVX512_CORE (ONEDNN_MAX_CPU_ISA), vLLM's own kernels unchanged.
ENGINES_BENCH = "docs/benchmarks.md, 2026-11-28"
INT8 = "W8A8 int8 (compressed-tensors)"
DECODE_BY_CHECKPOINT = (
    DecodeSpeed(False, "avx512f", INT8, 2.2, f"AVX-512 cores, oneDNN without bf16 (emulated), {ENGINES_BENCH}"),
    DecodeSpeed(True, "avx512_bf16", INT8, 1.1, f"avx512_bf16 without AMX, {ENGINES_BENCH}"),
    DecodeSpeed(True, "avx512_bf16", "AWQ int4", 0.56, f"avx512_bf16 without AMX, generic int4 path, {ENGINES_BENCH}"),
)
# "Much faster": the plan names another format only when it decoded at least this much faster than bf16.
FASTER_CHECKPOINT_RATIO = 1.3


def faster_checkpoints(
    native_bf16: bool, isa: frozenset[str], facts: tuple[DecodeSpeed, ...] = DECODE_BY_CHECKPOINT
) -> list[DecodeSpeed]:
    """The formats measured to decode much faster than bf16 on cores like these (the same bf16 arithmetic, the flag
    the measured cores had), fastest first."""
    found = [
        d
        for d in facts
        if d.native_bf16 == native_bf16 and d.cores_with in isa and d.vs_bf16 >= FASTER_CHECKPOINT_RATIO
    ]
    return sorted(found, key=lambda d: -d.vs_bf16)


def _bf16_without_native_arithmetic(spec: CpuLLMServiceSpec, node: NodeProfile, ranks: Ranks) -> str | None:
    flags = BF16_FLAGS.get(node.arch)
    if spec.model.dtype != DType.BFLOAT16 or flags is None or not node.isa or node.isa & set(flags):
        return None
    message = (
        f"bfloat16 on {ranks.where}, whose CPUs have no bf16 arithmetic ({' or '.join(flags)}): vLLM widens each "
        "weight to float32 before it multiplies, and decode runs at what that widening allows rather than at memory "
        "speed (measured on AVX2 cores: about 11-12 GB/s of weights per core, docs/benchmarks.md); for speed, run "
        f"on nodes that have it (cpu.requiredISA: [{flags[0]}])"
    )
    faster = faster_checkpoints(False, node.isa) if ranks.checkpoint is None else []
    if faster:
        best = faster[0]
        message += (
            f", or serve a {best.checkpoint} checkpoint of the same model (model.name): it decoded one sequence "
            f"{best.vs_bf16:.1f}x as fast as bf16 on such cores ({best.measured})"
        )
    return message


def _vllm_version_unknown(spec: CpuLLMServiceSpec, node: NodeProfile, ranks: Ranks) -> str | None:
    if ranks.vllm_version is not None and ranks.vllm_version in RELEASES:
        return None
    what = f"vLLM {ranks.vllm_version}, which" if ranks.vllm_version else f"{ranks.image}, whose vLLM version"
    return (
        f"{what} the operator does not know: the plan counts on none of the launcher's fixes to vLLM (a larger "
        f"memory limit, no AOT compile cache); known: {', '.join(RELEASES)}. Set spec.vllmVersion where the image's "
        "tag does not say it"
    )


@dataclass(frozen=True)
class Caution:
    condition: str  # the condition type, False while the caution holds
    reason: str
    check: Callable[[CpuLLMServiceSpec, NodeProfile, Ranks], str | None]  # its message, None: it does not hold


CAUTIONS = (
    Caution("NUMAAligned", "RankSpansNUMANodes", _rank_spans_numa_nodes),
    Caution("NativeBF16", "BF16WithoutNativeArithmetic", _bf16_without_native_arithmetic),
    Caution("VLLMVersionKnown", "UnknownVLLMVersion", _vllm_version_unknown),
)


def plan_cautions(spec: CpuLLMServiceSpec, node: NodeProfile, ranks: Ranks) -> list[PlanCaution]:
    """The cautions that hold for a plan on `node` (the chosen nodes' common profile)."""
    found = ((caution, caution.check(spec, node, ranks)) for caution in CAUTIONS)
    return [PlanCaution(condition=c.condition, reason=c.reason, message=m) for c, m in found if m is not None]
