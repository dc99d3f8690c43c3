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


def _bf16_without_native_arithmetic(spec: CpuLLMServiceSpec, node: NodeProfile, ranks: Ranks) -> str | None:
    flags = BF16_FLAGS.get(node.arch)
    if spec.model.dtype != DType.BFLOAT16 or flags is None or not node.isa or node.isa & set(flags):
        return None
    return (
        f"bfloat16 on {ranks.where}, whose CPUs have no bf16 arithmetic ({' or '.join(flags)}): vLLM widens each "
        "weight to float32 before it multiplies, and decode runs at what that widening allows rather than at memory "
        "speed (measured on AVX2 cores: about 11-12 GB/s of weights per core, docs/benchmarks.md); for speed, run "
        f"on nodes that have it (cpu.requiredISA: [{flags[0]}])"
    )


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
