"""A vLLM CPU pod's memory, term by term: each term stands for a named thing and scales with what it depends on.

    limit = (server processes + TP x (weight shard + KV cache + rank runtime + packed embeddings) + page cache in use)
            x (1 + margin) + /dev/shm

The constants are measured with the memory cgroup the kubelet limits a container with (bench/sizes_bench.py: random
weights of 20M to 3B parameters, two vocabularies); docs/calibration.md has what each term stands for, the runs that
measured it, and the working set's share of the limit they left (0.80-0.95).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cpullm.api.spec import Adapter
from cpullm.core import constants as c
from cpullm.core.adapters import adapter_bytes
from cpullm.core.sizing import ModelSize

# API server + engine core + launcher, measured: 1,108 MiB of anonymous memory with a 447-entry vocabulary, and
# 2,115 bytes more per vocabulary entry (1.381 GiB at Qwen2.5's 151,936 entries, 1.150 at TinyLlama's 32,000).
SERVER_BASE_BYTES = 1108 * c.MiB
SERVER_BYTES_PER_VOCAB_ENTRY = 2115
# Of that, the engine core's process of its own (Python, torch and vLLM's state, and the file pages only it kept
# active), which a rank running in it shares: the working set's peak fell by 0.66 GiB (tiny model) and 0.58 GiB
# (Qwen2.5-0.5B) with the rank in the engine core, anonymous memory by 0.53 and 0.57 GiB (docs/calibration.md).
ENGINE_CORE_PROCESS_BYTES = 590 * c.MiB
# And of the rest, what an engine core forked from the API server shares with it (the pages of the imports of torch
# and vLLM neither writes to): the working set's peak fell by 0.34 GiB (tiny model) and 0.34 GiB (Qwen2.5-0.5B),
# anonymous memory by 0.34 and 0.33 GiB, with the engine core forked (docs/calibration.md).
FORKED_ENGINE_CORE_SHARED_BYTES = 340 * c.MiB
# A config without vocab_size (spec.model.weightsBytes sizes its weights) is not assumed to have a small one.
UNKNOWN_VOCABULARY = 262_144
# A worker beyond its weights and KV cache, measured: 582 MiB + 13.7 MiB per decoder layer (0.62 GiB at 4 layers,
# 0.85 at 22, 0.91 at 24, 0.94 at 28, fitted; 1.03 at 36 layers predicted within 20 MiB), with a long prompt and a
# full batch served.
RANK_BASE_BYTES = 582 * c.MiB
RANK_BYTES_PER_LAYER = 14 * c.MiB
# vLLM 0.32 builds a oneDNN matmul for each unquantized vocabulary-sized module, the input embedding and the LM head
# (layers/vocab_parallel_embedding.py: dispatch_cpu_unquantized_gemm with remove_weight=False), and keeps the weight
# (the embedding lookup reads it) beside oneDNN's packed copy. A tied LM head is a module of its own that shares the
# weight, so it packs a copy too: two copies of vocabulary x width per rank (its vocabulary slice). Measured with
# float32 weights on AVX2: the engine core held 1.07 GiB (Qwen2.5-0.5B), 0.60 (TinyLlama-1.1B, untied) and 1.84
# (Qwen2.5-1.5B) more than the bf16 runs and the weights again, against two copies of 1.01, 0.49 and 1.74 GiB
# (docs/calibration.md).
PACKED_EMBEDDING_COPIES = 2
# Where oneDNN builds that matmul: float32 on every x86 CPU; the 16-bit dtypes need one of these flags (AVX-512, or
# AVX2's VNNI-2 generation). Without them vLLM logs "Failed to create oneDNN linear" and falls back to torch's
# linear, which keeps no copy (bf16 on AVX2: measured). On arm64 vLLM's oneDNN runs on the Arm Compute Library: not
# measured, counted.
ONEDNN_16_BIT_MATMUL_ISA = frozenset({"avx512f", "avx_ne_convert"})
ONEDNN_MATMUL_ISA_BY_DTYPE = {
    "float32": None,
    "bfloat16": ONEDNN_16_BIT_MATMUL_ISA,
    "float16": ONEDNN_16_BIT_MATMUL_ISA,
}
# Working set less anonymous memory at the peak, measured: 0.22 GiB (tiny model), 0.46-0.52 GiB (0.5B to 3B) at TP 1;
# with the checkpoint's pages dropped after loading (fix 5), 0.38-0.58 GiB (0.5B to 3B) at TP 1, 0.32 (0.5B) and 0.63
# (1.5B) at TP 2, where they were 1.18-1.26 at 1.5B without. These pages are reclaimable; the margin covers the rest.
PAGE_CACHE_BYTES = 448 * c.MiB
# Over the measured parts: a node whose kernel or allocator holds a few % more than the measurement's did (page
# tables and slab grow with the memory mapped, tcmalloc's caches with its threads). With it the working set's peak
# measured 0.84-0.94 of the limit from 20M to 3B parameters, at TP 1 and 2 (docs/calibration.md, 2026-11-27).
MARGIN_FRACTION = 0.05
# /dev/shm's size: each of vLLM's shared-memory ring buffers (the engine's broadcast to the workers, each worker's
# reply; 10 chunks of 24 MiB) checks for its 240 MiB free when it is made (shm_broadcast.check_shm_free_space). They
# are sparse: only what is written is charged.
SHM_SIZE_BASE_BYTES = 256 * c.MiB
SHM_SIZE_PER_RANK_BYTES = 256 * c.MiB  # with TP > 1
# What the limit counts of it: the broadcast ring written full (256 MiB), and 128 MiB per rank at TP > 1 for the
# replies and the ranks' all-reduce. Measured: under 1 MiB written at TP 1 and TP 2, a long prompt and a full batch
# served (the ring's messages, scheduler outputs, are kilobytes).
SHM_CHARGED_BASE_BYTES = 256 * c.MiB
SHM_CHARGED_PER_RANK_BYTES = 128 * c.MiB  # with TP > 1


def onednn_packs_embeddings(arch: str, isa: frozenset[str], dtype: str) -> bool:
    """Does vLLM keep oneDNN's packed copies of the embeddings (PACKED_EMBEDDING_COPIES) on this node?"""
    if arch != "amd64":
        return True
    needs = ONEDNN_MATMUL_ISA_BY_DTYPE[dtype]
    return needs is None or bool(isa & needs)


def shm_size_bytes(tp: int) -> int:
    """The size of the pod's /dev/shm."""
    return SHM_SIZE_BASE_BYTES + (tp * SHM_SIZE_PER_RANK_BYTES if tp > 1 else 0)


@dataclass(frozen=True)
class MemoryBudget:
    """A pod's memory, part by part."""

    tensor_parallel_size: int
    server_bytes: int
    shard_bytes: int
    kv_bytes: int
    rank_runtime_bytes: int
    packed_embeddings_bytes: int
    adapter_bytes: int  # LoRA adapters' slots and cached weights (core/adapters.py)
    page_cache_bytes: int
    shm_bytes: int  # what the limit counts of /dev/shm

    @property
    def per_rank_bytes(self) -> int:
        """What one rank needs on its NUMA node: its weight shard, KV cache, runtime, packed embeddings and
        adapters, with the margin."""
        held = (
            self.shard_bytes
            + self.kv_bytes
            + self.rank_runtime_bytes
            + self.packed_embeddings_bytes
            + self.adapter_bytes
        )
        return math.ceil(held * (1 + MARGIN_FRACTION))

    @property
    def limit_bytes(self) -> int:
        """The container's memory request and limit, rounded up to a whole MiB."""
        shared = math.ceil((self.server_bytes + self.page_cache_bytes) * (1 + MARGIN_FRACTION))
        total = shared + self.tensor_parallel_size * self.per_rank_bytes + self.shm_bytes
        return math.ceil(total / c.MiB) * c.MiB


def memory_budget(
    model: ModelSize,
    tp: int,
    shard_bytes: int,
    kv_gib: int,
    adapters: Sequence[Adapter] | None,
    *,
    rank_in_engine_core: bool,
    engine_core_forked: bool = False,
    embeddings_packed: bool,
) -> MemoryBudget:
    """`rank_in_engine_core`, `engine_core_forked`: what the launcher's fix 3 does for the server (Plan's fields);
    `embeddings_packed`: onednn_packs_embeddings on the node; `adapters`: spec.adapters."""
    anatomy = model.anatomy
    vocabulary = anatomy.vocabulary or UNKNOWN_VOCABULARY
    shared_process = ENGINE_CORE_PROCESS_BYTES if rank_in_engine_core else 0
    shared_process += FORKED_ENGINE_CORE_SHARED_BYTES if rank_in_engine_core and engine_core_forked else 0
    return MemoryBudget(
        tensor_parallel_size=tp,
        server_bytes=SERVER_BASE_BYTES + SERVER_BYTES_PER_VOCAB_ENTRY * vocabulary - shared_process,
        shard_bytes=shard_bytes,
        kv_bytes=kv_gib * c.GiB,
        rank_runtime_bytes=RANK_BASE_BYTES + RANK_BYTES_PER_LAYER * anatomy.layers,
        packed_embeddings_bytes=(
            PACKED_EMBEDDING_COPIES * math.ceil(anatomy.embedding_parameters / tp) * model.dtype_bytes
            if embeddings_packed
            else 0
        ),
        adapter_bytes=adapter_bytes(model, adapters, tp),
        page_cache_bytes=PAGE_CACHE_BYTES,
        shm_bytes=SHM_CHARGED_BASE_BYTES + (tp * SHM_CHARGED_PER_RANK_BYTES if tp > 1 else 0),
    )
