"""Fixes to vLLM 0.32's CPU backend, applied inside its processes. Shipped into the vLLM container as
`sitecustomize.py` (core/children/launcher.py); the in-pod launcher puts its directory first on the server's
PYTHONPATH, so every Python process of the server (the API server, the engine core, the workers vLLM spawns)
runs it at start-up. Each fix patches one vLLM module when vLLM imports it (an import hook), so a process that
never imports vLLM pays nothing; a vLLM without what a fix patches is left as it is, with one line on stderr.
A new fix is a function and an entry in FIXES. The env variable CPULLM_VLLM_FIXES_OFF (spec.env) names fixes to
leave out, comma-separated (e.g. `short_warm_up`), for a vLLM or a model a fix does not suit.

1. The KV check leaves out reclaimable page cache (`leave_page_cache_out`). Before it allocates the KV cache,
   the CPU worker requires the container's memory limit less its usage to hold the cache
   (`cpu_worker.determine_available_memory` through `cpu_resource_utils.get_memory_node_info`, which clamps to the
   cgroup since vllm PR 45086), and the usage it reads (`memory.current`, v1 `memory.usage_in_bytes`) counts page
   cache: the image's libraries and the model's files, charged to the container that first reads (or downloads)
   them. A pod that was the first on its node to read them failed its first start ("Available memory on node 0
   (0.11/3.56 GiB) on kv cache allocation is less than requested memory for kv (1.0 GiB)", docs/calibration.md)
   and started after a restart, in a new cgroup. Those pages are the kernel's to reclaim when the cache is
   allocated; what cannot be reclaimed is the rest: anonymous memory, shmem (/dev/shm) and kernel memory. So
   `get_cgroup_memory_usage` returns usage less the cgroup's file LRU pages (memory.stat `active_file` +
   `inactive_file`; v1 `total_active_file` + `total_inactive_file`, hierarchical as its usage is), for every vLLM
   reader of it (the KV check, the weight loader's prefetch choice).
2. The warm-up compiles with a short step (`short_warm_up`). At every start the CPU worker's warm-up runs
   `profile_run`, a forward of max_num_batched_tokens (2,048 by default) dummy tokens, to make torch.compile build
   the model's graph. The graph is compiled once for the whole range of step sizes (vLLM's compile range
   [1, max_num_batched_tokens]), so a step of WARM_UP_TOKENS builds the same graph, and the rest of that forward is
   compute no cache keeps: 2 x parameters x 2,048 operations, ~57 s of a ~0.5B model's second start on two AVX2
   cores (docs/startup.md). The first long prompt then reaches the activations' peak instead, which the memory
   limit holds (measured: same peak working set, same long-prompt latency, no compilation at serving time).
3. One rank runs in the engine core process (`rank_in_engine_core`). vLLM 0.32's CPU platform turns its one-process
   executor into the multiprocess one, so a server of one rank is three processes started one after the other
   (the API server, the engine core, one worker), each importing torch and vLLM: ~10 s of every start on two
   AVX2 cores, and a process's worth of memory. The reason it gives is the OpenMP environment, which a process
   reads when it loads its OpenMP runtime; the engine core is itself a process vLLM starts (spawned), so the
   environment vLLM would give the worker (its rule: `OMPProcessManager.configure_omp_envs`) is given to the
   engine core instead, set in the API server before it starts it. With one rank and one engine, the fix keeps
   vLLM's one-process executor (VLLM_ENABLE_V1_MULTIPROCESSING=0, unless set in the environment) and sets that
   environment. More ranks, more engines, or VLLM_ENABLE_V1_MULTIPROCESSING set otherwise: left as vLLM does it.
   Where the OpenMP runtime is Intel's (x86), the engine core is also forked from the API server rather than
   spawned (`engine_core_forked`, which CPULLM_VLLM_FIXES_OFF turns off on its own): it shares the API server's
   imports instead of importing torch and vLLM again.
4. vLLM's AOT compile cache loads what it saved (`aot_cache_loads`). With VLLM_USE_AOT_COMPILE (the operator sets it
   where this fix runs and the model cache is kept across pods, Plan.aotCompileCache), the first start saves the
   compiled model under VLLM_CACHE_ROOT and a later start with the same model and settings loads it instead of
   tracing the model again with torch.compile (most of a second start's compilation: docs/startup.md). On CPU every
   such load failed on one call: `_try_load_aot_compiled_fn` finishes the load with `compiled_fn.finalize_loading`,
   a method of vLLM's own backend's function, and the CPU platform compiles with plain inductor, whose loaded
   function is complete and has no such method ("'function' object has no attribute 'finalize_loading'"); vLLM then
   compiled anew and saved again at every start. While vLLM loads, the fix gives a loaded function lacking that
   method one that does nothing. A function that has it (vLLM's backend, another platform) is left as it is.
5. The checkpoint's page cache is dropped once the weights are loaded (`checkpoint_pages_dropped`). vLLM's default
   loader reads each safetensors file whole in every rank (`safetensors_weights_iterator`: `get_tensor` on every
   tensor, then each rank keeps its slice), so at TP > 1 every page of the checkpoint is read by each rank, and a
   page read twice is on the kernel's active list: the working set, what the kubelet evicts on, held 1.18 GiB of
   page cache at TP 2 on Qwen2.5-1.5B, 0.96 of the container's limit (docs/calibration.md). The weights are in
   the ranks' memory by then, and nothing reads those pages again until the next start. After the default
   loader's load_weights, each rank asks the kernel to drop the checkpoint's clean pages (vLLM's own
   `drop_checkpoint_cache`: POSIX_FADV_DONTNEED on the model's *.safetensors, which leaves a page another process
   still maps). The next start reads them from disk again.

Each process also writes one line per fix it tried to the report vllm_support.REPORT_ENV names (the container's
termination message: core/server_exits.py reads it from the pod's status).

Which fixes are for which vLLM versions is cpullm/vllm_support.py's table (a fix outside its versions does not
load), shared with the planner. This file imports the standard library only, like the launcher; the pod's copy
carries that table inline.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# <vllm_support> The pod's copy holds cpullm/vllm_support.py here instead (core/children/launcher.py inlines it).
from cpullm.vllm_support import (
    ENGINE_CORE_FORKED,
    INTEL_OPENMP,
    LOADED,
    MULTIPROCESSING_ENV,
    NOT_FOR_THIS_VLLM,
    NOT_THIS_RUNTIME,
    NOTHING_TO_PATCH,
    OFF_ENV,
    REPORT_ENV,
    REPORT_PATH,
    TURNED_OFF,
    fix_applies,
    names_turned_off,
    report_line,
)

# </vllm_support>
CGROUP_ROOT = Path("/sys/fs/cgroup")
GIB = 1 << 30
# What starts each line this module writes on stderr (the tests find the fixes in the server's log by it).
LOG_PREFIX = "cpullm-vllm:"
# memory.stat keys of the file LRU lists, by where vLLM reads usage from (the same test as vLLM's: v2 when
# memory.max exists at the mount's root).
FILE_PAGES_V2 = ("active_file", "inactive_file")
FILE_PAGES_V1 = ("total_active_file", "total_inactive_file")
# The warm-up step's tokens: more than 1, since torch.compile specializes on sizes 0 and 1.
WARM_UP_TOKENS = 16
# What fix 3 says once it has kept the one-process executor (then the OpenMP variables it set, if any).
RANK_IN_ENGINE_CORE = "one rank runs in the engine core process"
# Where vLLM 0.32 keeps its rule for a worker's OpenMP environment.
OMP_MODULE = "vllm.utils.ompmultiprocessing"
# How vLLM starts its engine core process (the CPU platform sets `spawn`), and what a process's own maps show of
# the OpenMP runtime it loaded: Intel's (libiomp5, the x86 image's LD_PRELOAD) reads its environment when first
# used, GNU's (libgomp) as it loads.
START_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
PROCESS_MAPS = Path("/proc/self/maps")
# What fix 4 says when it completed a load of vLLM's AOT compile cache (the tests find it in the server's log).
AOT_LOADED = "the compiled model was loaded from vLLM's AOT compile cache"
# What fix 3 adds to its line when the engine core is forked.
FORKED = "forked from the API server"
# Where fix 5 finds vLLM's drop_checkpoint_cache, and what it says once it has dropped the checkpoint's pages.
WEIGHT_UTILS_MODULE = "vllm.model_executor.model_loader.weight_utils"
CHECKPOINT_DROPPED = "the checkpoint's page cache dropped after loading the weights"


def report(message: str) -> None:
    print(f"{LOG_PREFIX} {message}", file=sys.stderr, flush=True)


def record(fix: str, outcome: str) -> None:
    """One line of the server's report (vllm_support.REPORT_PATH, or the file REPORT_ENV names; none outside a
    container that has one): a line another process wrote already is not written again, so the report stays
    within the kubelet's 4 KiB for any number of ranks."""
    path = os.environ.get(REPORT_ENV) or (REPORT_PATH if os.path.exists(REPORT_PATH) else None)
    if not path:
        return
    line = report_line(fix, outcome)
    try:
        with open(path, "a+") as report_file:
            report_file.seek(0)
            if line not in report_file.read():
                report_file.write(line)
    except OSError as error:  # a report that cannot be written never stops a server
        report(f"cannot write the fixes' report to {path}: {error.strerror}")


def file_pages(root: Path = CGROUP_ROOT) -> int | None:
    """The container cgroup's page cache on the file LRU lists, in bytes; None when memory.stat is unreadable."""
    if (root / "memory.max").exists():
        stat_file, keys = root / "memory.stat", FILE_PAGES_V2
    else:
        stat_file, keys = root / "memory" / "memory.stat", FILE_PAGES_V1
    try:
        lines = stat_file.read_text().splitlines()
    except OSError:
        return None
    values = dict(line.split(maxsplit=1) for line in lines if " " in line)
    try:
        return sum(int(values[key]) for key in keys)
    except (KeyError, ValueError):
        return None


def without_page_cache(read_usage: Callable[[], int | None], root: Path = CGROUP_ROOT) -> Callable[[], int | None]:
    """`read_usage` less the cgroup's file pages, reporting each correction on stderr."""

    def usage_the_kernel_cannot_reclaim() -> int | None:
        usage = read_usage()
        cache = file_pages(root) if usage is not None else None
        if usage is None or not cache:
            return usage
        corrected = max(0, usage - cache)
        report(
            f"cgroup usage {usage / GIB:.2f} GiB less {cache / GIB:.2f} GiB of reclaimable page cache: "
            f"{corrected / GIB:.2f} GiB"
        )
        return corrected

    return usage_the_kernel_cannot_reclaim


def leave_page_cache_out(module: ModuleType) -> bool:
    """Fix 1, on vllm.utils.cpu_resource_utils."""
    original = getattr(module, "get_cgroup_memory_usage", None)
    if not callable(original):
        return False
    module.get_cgroup_memory_usage = without_page_cache(original)  # type: ignore[attr-defined]
    return True


def short_warm_up(module: ModuleType) -> bool:
    """Fix 2, on vllm.v1.worker.cpu_model_runner: the warm-up's profile_run sees at most WARM_UP_TOKENS as the
    step's size (max_num_tokens, which sizes its dummy forward), restored when it returns."""
    runner = getattr(module, "CPUModelRunner", None)
    warm_up = getattr(runner, "warming_up_model", None)
    if runner is None or not callable(warm_up):
        return False

    def warming_up_model(self: Any) -> None:
        full = self.max_num_tokens
        self.max_num_tokens = min(WARM_UP_TOKENS, full)
        report(f"warm-up compiles with a {self.max_num_tokens}-token step, not {full}")
        try:
            warm_up(self)
        finally:
            self.max_num_tokens = full

    runner.warming_up_model = warming_up_model
    return True


def rank_in_engine_core(module: ModuleType) -> bool:
    """Fix 3, on vllm.platforms.cpu: CpuPlatform.check_and_update_config, which runs in the API server before it
    starts the engine core, keeps the one-process executor for one rank and sets the rank's OpenMP environment."""
    platform = getattr(module, "CpuPlatform", None)
    check = getattr(platform, "check_and_update_config", None)
    if platform is None or not callable(check):
        return False

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        parallel = vllm_config.parallel_config
        one_rank = parallel.world_size_across_dp == 1 and parallel.distributed_executor_backend == "uni"
        manager = omp_process_manager() if one_rank else None
        if manager is not None:
            os.environ.setdefault(MULTIPROCESSING_ENV, "0")
        check(vllm_config)
        if manager is not None and parallel.distributed_executor_backend == "uni":
            chosen = engine_core_omp_env(manager(vllm_config))
            how = f", {FORKED}" if engine_core_forked() else ""
            report(f"{RANK_IN_ENGINE_CORE}{how}{' with ' + chosen if chosen else ''}")

    platform.check_and_update_config = classmethod(check_and_update_config)
    return True


def omp_process_manager() -> Any:
    """vLLM's rule for a worker's OpenMP environment (OMPProcessManager), or None, said on stderr, when this vLLM
    has none: then the rank stays in a worker process of its own, whose threads vLLM binds its way, and which a
    plan with rankInEngineCore does not count: the line says how to get a plan that does."""
    try:
        return importlib.import_module(OMP_MODULE).OMPProcessManager
    except (ImportError, AttributeError):
        record(rank_in_engine_core.__name__, NOTHING_TO_PATCH)
        report(
            f"no {OMP_MODULE}.OMPProcessManager in this vLLM: the rank stays in a worker process, which the plan's "
            f"memory limit does not count; set {OFF_ENV}={rank_in_engine_core.__name__} in the service's env for a "
            "limit that does"
        )
        return None


def engine_core_forked() -> bool:
    """Part of fix 3, turned off by its own name: the engine core that holds the rank is forked from the API server
    instead of spawned, so it shares the API server's imports of torch and vLLM (6-12 s of every start on two AVX2
    cores, and 0.34 GiB, docs/startup.md) instead of importing them again. Only where the OpenMP runtime loaded
    here is Intel's, which reads the rank's environment when the engine core first uses it; GNU's read its
    environment as it loaded in the API server, before that environment was set, so there the engine core is
    spawned as vLLM does. Called where the API server sets that environment, in the process that starts the engine
    core."""
    if turned_off(engine_core_forked) or not for_this_vllm(ENGINE_CORE_FORKED):
        record(ENGINE_CORE_FORKED, TURNED_OFF if turned_off(engine_core_forked) else NOT_FOR_THIS_VLLM)
        return False
    try:
        intel = INTEL_OPENMP in PROCESS_MAPS.read_text()
    except OSError:
        intel = False
    if intel:
        os.environ[START_METHOD_ENV] = "fork"
    record(ENGINE_CORE_FORKED, LOADED if intel else NOT_THIS_RUNTIME)
    return intel


def engine_core_omp_env(manager: Any) -> str:
    """Sets in this process's environment, for the engine core it starts, what vLLM's OMPProcessManager sets for a
    worker of rank 0; returns what changed as `NAME=value` pairs (nothing with `nobind`, or when set before)."""
    before = dict(os.environ)
    with manager.configure_omp_envs(rank=0, local_rank=0):
        chosen = {name: value for name, value in os.environ.items() if before.get(name) != value}
    os.environ.update(chosen)
    return " ".join(f"{name}={value}" for name, value in sorted(chosen.items()))


def aot_cache_loads(module: ModuleType) -> bool:
    """Fix 4, on vllm.compilation.decorators: while _try_load_aot_compiled_fn runs, torch's load_compiled_function
    returns a function whose compiled part has a finalize_loading (adding one that does nothing where it lacks it)."""
    load = getattr(module, "_try_load_aot_compiled_fn", None)
    compiler: Any = getattr(getattr(module, "torch", None), "compiler", None)
    if not callable(load) or not callable(getattr(compiler, "load_compiled_function", None)):
        return False

    def try_load_aot_compiled_fn(model: Any, path: str) -> Any:
        original = compiler.load_compiled_function
        completed = []

        def load_compiled_function(*args: Any, **kwargs: Any) -> Any:
            loaded = original(*args, **kwargs)
            compiled = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
            if compiled is not None and not hasattr(compiled, "finalize_loading"):
                compiled.finalize_loading = nothing_to_finalize
                completed.append(compiled)
            return loaded

        compiler.load_compiled_function = load_compiled_function
        try:
            fn = load(model, path)
        finally:
            compiler.load_compiled_function = original
        if fn is not None and completed:
            report(AOT_LOADED)
        return fn

    module._try_load_aot_compiled_fn = try_load_aot_compiled_fn  # type: ignore[attr-defined]
    return True


def checkpoint_pages_dropped(module: ModuleType) -> bool:
    """Fix 5, on vllm.model_executor.model_loader.default_loader: DefaultModelLoader.load_weights, then the
    checkpoint's page cache dropped by weight_utils.drop_checkpoint_cache."""
    loader = getattr(module, "DefaultModelLoader", None)
    load_weights = getattr(loader, "load_weights", None)
    if loader is None or not callable(load_weights):
        return False
    try:
        drop = importlib.import_module(WEIGHT_UTILS_MODULE).drop_checkpoint_cache
    except (ImportError, AttributeError):
        return False
    if not callable(drop):
        return False

    def load_weights_then_drop_their_pages(self: Any, model: Any, model_config: Any) -> None:
        load_weights(self, model, model_config)
        try:
            drop(model_config.model, model_config.revision, self.load_config.download_dir)
        except Exception as error:  # pages left in the cache never stop a start that has its weights
            report(f"the checkpoint's page cache left as it is: {type(error).__name__}")
            return
        report(CHECKPOINT_DROPPED)

    loader.load_weights = load_weights_then_drop_their_pages
    return True


def nothing_to_finalize(vllm_config: Any) -> None:
    """What finalize_loading does for inductor's loaded function: nothing; it is complete when torch loads it."""
    del vllm_config


# The vLLM module each fix patches, as vLLM names it, and the fix.
FIXES: dict[str, Callable[[ModuleType], bool]] = {
    "vllm.utils.cpu_resource_utils": leave_page_cache_out,
    "vllm.v1.worker.cpu_model_runner": short_warm_up,
    "vllm.platforms.cpu": rank_in_engine_core,
    "vllm.compilation.decorators": aot_cache_loads,
    "vllm.model_executor.model_loader.default_loader": checkpoint_pages_dropped,
}


def turned_off(fix: Callable[..., Any]) -> bool:
    """Whether this process's OFF_ENV names the fix (or part of one)."""
    return fix.__name__ in names_turned_off(os.environ.get(OFF_ENV, ""))


def vllm_version() -> str | None:
    """The version of the vLLM being imported (its package is, before any of its modules); None: it does not say."""
    version = getattr(sys.modules.get("vllm"), "__version__", None)
    if version is None:
        try:
            version = importlib.import_module("vllm.version").__version__
        except Exception:  # a vLLM without a version module: the fixes check what they patch anyway
            return None
    return str(version)


def for_this_vllm(name: str) -> bool:
    """Whether the fix `name` is for this vLLM's version (cpullm/vllm_support.py); one that does not say: yes."""
    version = vllm_version()
    return version is None or fix_applies(name, version)


def apply(module: ModuleType) -> bool:
    """The module's fix; False (and one line on stderr) when it is turned off, not for this vLLM's version, or this
    vLLM lacks what it patches."""
    fix = FIXES[module.__name__]
    if turned_off(fix):
        report(f"{module.__name__}: {fix.__name__} turned off ({OFF_ENV})")
        record(fix.__name__, TURNED_OFF)
        return False
    if not for_this_vllm(fix.__name__):
        report(f"{module.__name__}: {fix.__name__} is not for vLLM {vllm_version()}; left as vLLM does it")
        record(fix.__name__, NOT_FOR_THIS_VLLM)
        return False
    if fix(module):
        record(fix.__name__, LOADED)
        return True
    report(f"{module.__name__}: nothing for {fix.__name__} to patch in this vLLM; left as it is")
    record(fix.__name__, NOTHING_TO_PATCH)
    return False


class _FixingLoader(importlib.abc.Loader):
    """Runs the module's own loader, then its fix."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        apply(module)

    def __getattr__(self, name: str) -> Any:
        """The rest (get_source for tracebacks, get_code, is_package) is the module's own loader's."""
        return getattr(self._loader, name)


class FixOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules in FIXES as the path finder would, with a loader that fixes each once it has run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in FIXES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _FixingLoader(spec.loader)
        return spec


def run_shadowed_sitecustomize(here: Path) -> None:
    """This file, as sitecustomize, hides the image's own (if any) further along sys.path: run that one too."""
    rest = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin is None or Path(spec.origin).resolve().parent == here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def install() -> None:
    if not any(isinstance(finder, FixOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, FixOnImport())


if __name__ == "sitecustomize":
    install()
    run_shadowed_sitecustomize(Path(__file__).resolve().parent)
