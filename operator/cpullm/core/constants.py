"""The planning and rendering constants, each with where it comes from.

A few constants live elsewhere on purpose, beside the code that gives them meaning: the node label names in
`core/topology.py` (the label contract its parser reads), the child labels and container names in
`core/children/common.py` (the shape of what is rendered), the model families the parameter formula covers in
`core/sizing/families.py` (each formula's scope), and everything read from the environment or flags in
`cpullm/settings.py` (runtime settings, not planning facts).

The memory model's terms and their measurements live in `core/memory.py`.
"""

from __future__ import annotations

from cpullm.vllm_support import DEFAULT_VERSION

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Bytes per weight/KV element by dtype name (the spec's dtype and a checkpoint's torch_dtype alike).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# The version of vLLM's published image the operator renders when no image is named (cpullm/vllm_support.py).
VLLM_VERSION = f"v{DEFAULT_VERSION}"
# vLLM publishes CPU images per arch on Docker Hub: vllm/vllm-openai-cpu:<version>-<arch suffix>.
DEFAULT_IMAGE_REPOSITORY = "docker.io/vllm/vllm-openai-cpu"
IMAGE_ARCH_SUFFIX = {"amd64": "x86_64", "arm64": "arm64"}
# The router's image where neither the spec (routing.router.image) nor the operator's administrator
# (settings.router_image) names one: HAProxy's official image, a moving tag the chart tells admins to pin by digest.
DEFAULT_ROUTER_IMAGE = "docker.io/library/haproxy:3.2"
# LD_PRELOAD as those images set it (vLLM's docker/Dockerfile.cpu, stages base-amd64 and base-arm64): tcmalloc,
# and on x86 Intel OpenMP from the image's venv. The pod's env replaces the image's, so render the same value;
# vLLM also reads it to choose how it pins OpenMP threads (KMP_AFFINITY when libiomp is preloaded).
LD_PRELOAD_BY_ARCH = {
    "amd64": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:/opt/venv/lib/libiomp5.so",
    "arm64": "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
}

# KV cache block size of vLLM's CPU backend for dense models (vllm/platforms/cpu.py, check_and_update_config):
# a context length capped to the KV cache is a whole number of blocks.
KV_BLOCK_TOKENS = 128
# ... and for MLA models where vLLM CPU runs its reference MLA decode kernel (no AMX): it compiles for 16 only.
MLA_KV_BLOCK_TOKENS = 16
# Tokens one scheduler step may prefill per rank: vLLM CPU's default max_num_batched_tokens for the OpenAI server
# is 2048 x TP (vllm/engine/arg_utils.py). A sliding-window layer keeps its window plus these in flight.
SERVER_BATCHED_TOKENS_PER_RANK = 2048

# vLLM CPU runs an fp8 KV cache (--kv-cache-dtype fp8) on x86 with AVX-512; AMX nodes have it too.
FP8_KV_CACHE_ISA = frozenset({"avx512f"})

# vLLM's CPU backend documents TP=6 as unsupported.
UNSUPPORTED_TENSOR_PARALLEL_SIZES = frozenset({6})

# The startup and readiness probes' period: how late after the server answers /health the kubelet marks it started
# and Ready (each up to one period: with 10 s, 5-14 s of a tiny model's 50-100 s starts on the real node were the
# wait, docs/startup.md). /health is cheap; a server under full load answers slowly, so readiness tolerates
# READINESS_TOLERANCE_SECONDS of failures before the pod leaves its Service.
PROBE_PERIOD_SECONDS = 2
READINESS_TOLERANCE_SECONDS = 30

# Draining a server (core/children/deployment.py's preStop, the router's timeouts): the longest a request may run
# is the context length decoded at a pessimistic rate. A CPU decode step streams the rank's weight shard from
# memory once per token (batched sequences share it), so a token takes shard bytes / bandwidth; 4 GB/s per rank
# is a fifth of the 19.2 GB/s a bf16 GEMV streamed on two cores of one of our machines (docs/routing.md).
DRAIN_DECODE_BYTES_PER_SECOND = 4 * 10**9
DRAIN_MIN_SECONDS = 30
DRAIN_MAX_SECONDS = 3600
# How long a stopping server keeps taking requests before it waits for its last ones: the EndpointSlice update
# reaching kube-proxy, and the router's next DNS answer (CoreDNS answers with a 5 s TTL; HAProxy re-resolves
# every second).
DRAIN_SETTLE_SECONDS = 10
# What vLLM takes to exit once told to (SIGTERM) after its requests are done.
SERVER_EXIT_SECONDS = 30

# The in-pod launcher (cpullm/launcher.py), shipped in a ConfigMap and mounted read-only here, with the fixes to vLLM
# (cpullm/vllm_fixes.py) as a sitecustomize module in a directory of its own, which the launcher puts first on the
# server's PYTHONPATH.
LAUNCHER_MOUNT = "/opt/cpullm"
LAUNCHER_FILE = "launcher.py"
VLLM_FIXES_FILE = "vllm_fixes.py"
SITECUSTOMIZE_FILE = "sitecustomize.py"
LAUNCHER_SITE_DIR = "site"
# The API key guard (cpullm/api_key_guard.py), shipped in the same ConfigMap into a directory of its own on the
# server's PYTHONPATH (without the fixes: it serves a pod without the launcher too), loaded by vLLM's --middleware.
API_KEY_GUARD_FILE = "api_key_guard.py"
API_KEY_GUARD_DIR = "guard"
API_KEY_GUARD_MODULE = "cpullm_api_key_guard"
API_KEY_GUARD_MIDDLEWARE = f"{API_KEY_GUARD_MODULE}.ApiKeyGuard"

MODEL_CACHE_MOUNT = "/models"
# Beside the weights in the default model cache: tokenizer, configs, the Hub cache's own files.
MODEL_CACHE_SPARE_BYTES = 2 * GiB
HF_HOME = f"{MODEL_CACHE_MOUNT}/huggingface"
# What a start compiles, kept beside the weights so a server that starts again with the same model cache reuses it
# (docs/startup.md): vLLM's own cache (the model registry's inspection of the architecture, modelinfos/, and its AOT
# compile cache, torch_compile_cache/) and inductor's (the C++ kernels torch.compile generates and builds with g++,
# and its FX graph cache).
VLLM_CACHE_ROOT = f"{MODEL_CACHE_MOUNT}/vllm"
COMPILE_CACHE_ENV = {
    "VLLM_CACHE_ROOT": VLLM_CACHE_ROOT,
    "TORCHINDUCTOR_CACHE_DIR": f"{VLLM_CACHE_ROOT}/inductor",
}
# vLLM's AOT compile cache: a later start loads the compiled model instead of tracing it again with torch.compile.
# On only where a new pod finds it and the launcher's fix lets vLLM load it on CPU (Plan.aotCompileCache; planner's
# _aot_compile_cache says why).
AOT_COMPILE_ENV = "VLLM_USE_AOT_COMPILE"

# The vLLM server's user where Pod Security restricted requires a non-root one (core/podsecurity.py), its group and
# the pod's fsGroup too, so the volumes it writes are its own; HOME points at a directory it can write, since the
# image's is root's.
SERVER_NON_ROOT_UID = 1001
SERVER_NON_ROOT_HOME = "/tmp"

# A spec that sets none of kvCacheGiB, maxModelLen and maxNumSeqs (`model.name` alone) is sized for
# DEFAULT_MAX_NUM_SEQS sequences of the model's context capped at DEFAULT_MAX_MODEL_LEN tokens: a CPU server decodes
# a handful of sequences at once at useful speed, and a model's full context (128K tokens for Llama 3.1) would make
# the KV cache dwarf the weights. The plan says these were chosen (max_model_len_source/max_num_seqs_source).
DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_MAX_NUM_SEQS = 8
