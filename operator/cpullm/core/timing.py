"""How long a vLLM CPU server's work may take, at the slowest pace measured (docs/startup.md): the budgets the
operator renders must hold on the slowest CPUs it may land on, not on the typical one.

Prefill is compute-bound: a step of T tokens costs each rank 2 x (parameters / TP) x T floating-point operations.
One scheduler step prefills up to max_num_batched_tokens, 2,048 x TP by default, so a rank computes
2 x parameters x 2,048 whatever TP is, on its own CPUs. vLLM runs one such step at every start (its warm-up,
profile_run; 16 tokens with the launcher's fix, cpullm/vllm_fixes.py, but the startup budget still counts a full
step for a server started without it), and gives any step VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s by default)
before it declares the engine dead: measured, a 2,048-token step of a 3B model on two AVX2 cores took longer, and
the server died at its first long prompt.
"""

from __future__ import annotations

import math

from cpullm.core import constants as c
from cpullm.core.sizing import ModelSize

# Prefill per CPU, bf16, the slowest measured: 2 AVX2 cores of an AMD EPYC without AVX-512 (bf16 without native
# support) prefilled 1,984-token prompts at 15.7 (Qwen2.5-1.5B), 16.2 (TinyLlama-1.1B) and 18.8 (Qwen2.5-0.5B)
# GFLOP/s per CPU. AVX-512 and AMX nodes prefill several times faster; the budgets below then hold with room.
PREFILL_FLOPS_PER_CPU = 15 * 10**9
# What the measured pace is multiplied by for a budget: a node busier than the measurement's, a noisier neighbour.
MARGIN = 2
# vLLM's own default for VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: never rendered lower.
STEP_TIMEOUT_MIN_SECONDS = 300
# A start without the model's weights: Python imports in the API server, engine core and each worker, torch.compile
# (inductor's kernels built with g++, or read from the compile cache) and the KV cache's allocation. Measured for the
# tiny model: 67-73 s cold on two CPUs (37-45 s with the compile cache), 82-102 s from pod creation to Ready on the
# real node's one CPU (docs/startup.md).
START_FIXED_SECONDS = 150
# Reading the weights into memory (safetensors, page cache cold): measured 2.4-3.4 s per GiB on local disk.
LOAD_SECONDS_PER_WEIGHT_GIB = 10
# What a start is expected to take, as against the budget above: the slowest start measured without the weights
# (102 s from pod creation to Ready on the real node) and the slowest measured read of the weights (3.4 s per GiB).
EXPECTED_FIXED_SECONDS = 102
EXPECTED_LOAD_SECONDS_PER_WEIGHT_GIB = 3.4
# The weights' download when the model cache does not hold them yet: not measured here (no internet); at 25 MB/s,
# a slow link's pace.
DOWNLOAD_SECONDS_PER_WEIGHT_GIB = 43


def parameters_of(model: ModelSize) -> int:
    """The parameters a prefill multiplies (the config's count, else the weights' bytes in the serving dtype)."""
    return model.parameters or model.weights_bytes // model.dtype_bytes


def step_seconds(model: ModelSize, cpus_per_rank: int) -> float:
    """One scheduler step of max_num_batched_tokens on each rank, at the slowest measured pace."""
    flops = 2 * parameters_of(model) * c.SERVER_BATCHED_TOKENS_PER_RANK
    return flops / (max(1, cpus_per_rank) * PREFILL_FLOPS_PER_CPU)


def step_timeout_seconds(model: ModelSize, cpus_per_rank: int) -> int:
    """VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: the margin over one step at the slowest pace, never below vLLM's own."""
    return max(STEP_TIMEOUT_MIN_SECONDS, math.ceil(MARGIN * step_seconds(model, cpus_per_rank)))


def startup_seconds(model: ModelSize, cpus_per_rank: int, weights_bytes: int) -> int:
    """The startup probe's budget: the margin over a cold start (the fixed part, the weights' load, the warm-up
    step), and the weights' download."""
    gib = weights_bytes / c.GiB
    start = START_FIXED_SECONDS + LOAD_SECONDS_PER_WEIGHT_GIB * gib + step_seconds(model, cpus_per_rank)
    return math.ceil(MARGIN * start + DOWNLOAD_SECONDS_PER_WEIGHT_GIB * gib)


def expected_start_seconds(weights_bytes: int) -> int:
    """How long a start is expected to take once the weights are on the node (the download comes on top): what was
    measured, not the budget; the plan shows both, so a reader does not take the probe's allowance for the
    expected wait."""
    return math.ceil(EXPECTED_FIXED_SECONDS + EXPECTED_LOAD_SECONDS_PER_WEIGHT_GIB * weights_bytes / c.GiB)
