"""Fixes to vLLM's CPU backend, applied inside its processes. Shipped into the vLLM container as `sitecustomize.py`
(core/children/launcher.py), first on the server's PYTHONPATH, so every Python process of the server runs it at
start-up. Each fix patches one vLLM module when vLLM imports it (an import hook): a process that never imports vLLM
pays nothing, and a vLLM without what a fix patches is left as it is, with one line on stderr.

A new fix is a function returning its outcome (vllm_support's words) and an entry in FIXES; vllm_support.py's table
says which vLLM versions it is for. CPULLM_VLLM_FIXES_OFF (spec.env) names fixes to leave out, comma-separated.
Each process writes one line per fix it tried to the container's termination message (core/server_exits.py reads
it). What each fix works around, how it was measured and what would retire it: docs/vllm-versions.md.

This file imports the standard library only, like the launcher; the pod's copy carries vllm_support.py inline.
"""

from __future__ import annotations

import ctypes
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
    CONTAINER_CPUS,
    CPU_PERIODS,
    CPU_THROTTLED_PERIODS,
    CPU_THROTTLED_SECONDS,
    CPU_USAGE_SECONDS,
    ENGINE_CORE_FORKED,
    INTEL_OPENMP,
    KERNEL_REFUSED,
    LOADED,
    MULTIPROCESSING_ENV,
    NOT_FOR_THIS_VLLM,
    NOT_THIS_CPU,
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
# Fix 6: the CPU flag of AMX tiles, and Linux's request for a process's permission to use their state
# (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), x86-64 only; docs: Documentation/arch/x86/xstate.rst).
CPUINFO = Path("/proc/cpuinfo")
AMX_TILE_FLAG = "amx_tile"
SYS_ARCH_PRCTL_X86_64 = 158
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
AMX_PERMITTED = "AMX tile state permitted (arch_prctl ARCH_REQ_XCOMP_PERM)"


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


def leave_page_cache_out(module: ModuleType) -> str:
    """Fix 1, on vllm.utils.cpu_resource_utils: vLLM's KV check reads the cgroup's usage less its page cache."""
    original = getattr(module, "get_cgroup_memory_usage", None)
    if not callable(original):
        return NOTHING_TO_PATCH
    module.get_cgroup_memory_usage = without_page_cache(original)  # type: ignore[attr-defined]
    return LOADED


def short_warm_up(module: ModuleType) -> str:
    """Fix 2, on vllm.v1.worker.cpu_model_runner: the warm-up's profile_run sees at most WARM_UP_TOKENS as the
    step's size (max_num_tokens, which sizes its dummy forward), restored when it returns."""
    runner = getattr(module, "CPUModelRunner", None)
    warm_up = getattr(runner, "warming_up_model", None)
    if runner is None or not callable(warm_up):
        return NOTHING_TO_PATCH

    def warming_up_model(self: Any) -> None:
        full = self.max_num_tokens
        self.max_num_tokens = min(WARM_UP_TOKENS, full)
        report(f"warm-up compiles with a {self.max_num_tokens}-token step, not {full}")
        try:
            warm_up(self)
        finally:
            self.max_num_tokens = full

    runner.warming_up_model = warming_up_model
    return LOADED


def rank_in_engine_core(module: ModuleType) -> str:
    """Fix 3, on vllm.platforms.cpu: CpuPlatform.check_and_update_config, which runs in the API server before it
    starts the engine core, keeps the one-process executor for one rank and sets the rank's OpenMP environment."""
    platform = getattr(module, "CpuPlatform", None)
    check = getattr(platform, "check_and_update_config", None)
    if platform is None or not callable(check):
        return NOTHING_TO_PATCH

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
    return LOADED


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


def aot_cache_loads(module: ModuleType) -> str:
    """Fix 4, on vllm.compilation.decorators: while _try_load_aot_compiled_fn runs, torch's load_compiled_function
    returns a function whose compiled part has a finalize_loading (adding one that does nothing where it lacks it)."""
    load = getattr(module, "_try_load_aot_compiled_fn", None)
    compiler: Any = getattr(getattr(module, "torch", None), "compiler", None)
    if not callable(load) or not callable(getattr(compiler, "load_compiled_function", None)):
        return NOTHING_TO_PATCH

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
    return LOADED


def checkpoint_pages_dropped(module: ModuleType) -> str:
    """Fix 5, on vllm.model_executor.model_loader.default_loader: DefaultModelLoader.load_weights, then the
    checkpoint's page cache dropped by weight_utils.drop_checkpoint_cache."""
    loader = getattr(module, "DefaultModelLoader", None)
    load_weights = getattr(loader, "load_weights", None)
    if loader is None or not callable(load_weights):
        return NOTHING_TO_PATCH
    try:
        drop = importlib.import_module(WEIGHT_UTILS_MODULE).drop_checkpoint_cache
    except (ImportError, AttributeError):
        return NOTHING_TO_PATCH
    if not callable(drop):
        return NOTHING_TO_PATCH

    def load_weights_then_drop_their_pages(self: Any, model: Any, model_config: Any) -> None:
        load_weights(self, model, model_config)
        try:
            drop(model_config.model, model_config.revision, self.load_config.download_dir)
        except Exception as error:  # pages left in the cache never stop a start that has its weights
            report(f"the checkpoint's page cache left as it is: {type(error).__name__}")
            return
        report(CHECKPOINT_DROPPED)

    loader.load_weights = load_weights_then_drop_their_pages
    return LOADED


def cpu_flags() -> frozenset[str]:
    """The CPU's flags as the kernel lists them (x86's `flags` line; none on arches that list `Features`)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def request_amx_tile_data() -> int:
    """Asks Linux for this process's permission to use AMX tile data; 0 when granted, else the errno. Granted once
    per process, kept across fork, cleared by exec: each Python process of the server asks for its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL_X86_64, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
        return 0
    return ctypes.get_errno() or -1


def amx_tile_permission(module: ModuleType) -> str:
    """Fix 6, on the vllm package itself, so before any of its kernels runs: where the CPU has AMX tiles, the
    process asks for their state. vLLM's CPU attention kernel runs AMX tile instructions without asking, and Linux
    raises SIGILL for them in a process that has not (oneDNN asks for itself, so only the attention dies)."""
    del module  # nothing in vLLM is patched: the permission is the process's
    if AMX_TILE_FLAG not in cpu_flags():
        return NOT_THIS_CPU
    error = request_amx_tile_data()
    if error:
        report(f"the kernel refused the AMX tile state (errno {error}): vLLM's AMX kernels will fail")
        return KERNEL_REFUSED
    report(AMX_PERMITTED)
    return LOADED


def _keyed(path: Path) -> dict[str, int]:
    """A cgroup file of `key value` lines (cpu.stat), as integers; {} when it cannot be read."""
    try:
        pairs = (line.split() for line in path.read_text().splitlines())
        return {pair[0]: int(pair[1]) for pair in pairs if len(pair) == 2 and pair[1].lstrip("-").isdigit()}
    except OSError:
        return {}


def _first_line(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_list_size(cpus: str) -> int:
    """How many CPUs a cpuset list names ('0-3,8' is 5)."""
    size = 0
    for part in filter(None, cpus.split(",")):
        first, _, last = part.partition("-")
        size += int(last or first) - int(first) + 1
    return size


def container_cpu(root: Path = CGROUP_ROOT) -> dict[str, float]:
    """What the container's cgroup (v2, or v1's cpu, cpuacct and cpuset hierarchies) says of its CPU, by
    vllm_support's series names; what cannot be read is left out. The CPUs it may use are its cpuset's, capped by its
    CFS quota (quota / period)."""
    found: dict[str, float] = {}
    if (root / "cpu.max").exists():  # v2, with the cpu controller
        stat = _keyed(root / "cpu.stat")
        usage, throttled = stat.get("usage_usec"), stat.get("throttled_usec")
        scale = 1e-6
        quota, _, period = (_first_line(root / "cpu.max") or "max").partition(" ")
        cpuset = _first_line(root / "cpuset.cpus.effective")
    else:
        stat = _keyed(root / "cpu" / "cpu.stat")
        usage, throttled = _keyed_value(root / "cpuacct" / "cpuacct.usage"), stat.get("throttled_time")
        scale = 1e-9
        quota = _first_line(root / "cpu" / "cpu.cfs_quota_us") or "-1"
        period = _first_line(root / "cpu" / "cpu.cfs_period_us") or ""
        cpuset = _first_line(root / "cpuset" / "cpuset.effective_cpus") or _first_line(root / "cpuset" / "cpuset.cpus")
    if usage is not None:
        found[CPU_USAGE_SECONDS] = usage * scale
    if throttled is not None:
        found[CPU_THROTTLED_SECONDS] = throttled * scale
    for key, series in (("nr_periods", CPU_PERIODS), ("nr_throttled", CPU_THROTTLED_PERIODS)):
        if key in stat:
            found[series] = float(stat[key])
    cpus = float(cpu_list_size(cpuset)) if cpuset else float(len(os.sched_getaffinity(0)))
    if quota.isdigit() and period.isdigit() and int(period) > 0:  # "max" (v2) and -1 (v1): no quota
        cpus = min(cpus, int(quota) / int(period))
    found[CONTAINER_CPUS] = cpus
    return found


def _keyed_value(path: Path) -> int | None:
    line = _first_line(path)
    return int(line) if line and line.isdigit() else None


class ContainerCpuCollector:
    """A prometheus_client collector (its documented extension point for custom metrics) of container_cpu's
    figures, read at each scrape. `families` is prometheus_client.metrics_core, as the process loaded it for vLLM
    (this file imports the standard library only)."""

    def __init__(self, families: ModuleType, root: Path = CGROUP_ROOT) -> None:
        self.families, self.root = families, root

    def collect(self) -> Any:
        for name, value in container_cpu(self.root).items():
            if name == CONTAINER_CPUS:
                help_text = "CPUs the container may use: its cpuset, capped by its CFS quota"
                yield self.families.GaugeMetricFamily(name, help_text, value=value)
            else:
                help_text = "From the container's cgroup (cpu.stat, cpuacct)"
                yield self.families.CounterMetricFamily(name.removesuffix("_total"), help_text, value=value)


def container_cpu_metrics(module: ModuleType) -> str:
    """Fix 7, not a fix but an addition, on vllm.v1.metrics.prometheus: the registry vLLM serves /metrics from also
    collects the container's cgroup CPU figures (ContainerCpuCollector), so the operator can tell a server held to
    fewer CPUs or throttled from one that is merely slow (core/performance_check.py)."""
    original = getattr(module, "get_prometheus_registry", None)
    families = sys.modules.get("prometheus_client.metrics_core")  # imported with prometheus_client, which vLLM's is
    if original is None or families is None:
        return NOTHING_TO_PATCH
    collecting: list[Any] = []  # the registries given a collector (a multiprocess one is made per call)

    def get_prometheus_registry(*args: Any, **kwargs: Any) -> Any:
        registry = original(*args, **kwargs)
        if not any(registry is seen for seen in collecting):
            registry.register(ContainerCpuCollector(families))
            collecting.append(registry)
        return registry

    module.get_prometheus_registry = get_prometheus_registry  # type: ignore[attr-defined]
    return LOADED


def nothing_to_finalize(vllm_config: Any) -> None:
    """What finalize_loading does for inductor's loaded function: nothing; it is complete when torch loads it."""
    del vllm_config


# The vLLM module each fix patches, as vLLM names it, and the fix; each returns its outcome (vllm_support's words).
FIXES: dict[str, Callable[[ModuleType], str]] = {
    "vllm": amx_tile_permission,
    "vllm.utils.cpu_resource_utils": leave_page_cache_out,
    "vllm.v1.worker.cpu_model_runner": short_warm_up,
    "vllm.platforms.cpu": rank_in_engine_core,
    "vllm.compilation.decorators": aot_cache_loads,
    "vllm.model_executor.model_loader.default_loader": checkpoint_pages_dropped,
    "vllm.v1.metrics.prometheus": container_cpu_metrics,
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
    outcome = fix(module)
    record(fix.__name__, outcome)
    if outcome == NOTHING_TO_PATCH:
        report(f"{module.__name__}: nothing for {fix.__name__} to patch in this vLLM; left as it is")
    return outcome == LOADED


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
