"""The fixes to vLLM (cpullm/vllm_fixes.py): the page cache read from recorded cgroup files, the wrapped usage
reader, the short warm-up, and the import hook as the server's Python processes run it (a fake `vllm` package)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from cpullm import vllm_fixes, vllm_support
from cpullm.api.spec import CpuSettings
from cpullm.core.children.launcher import SOURCES
from cpullm.core.constants import SITECUSTOMIZE_FILE
from cpullm.vllm_fixes import GIB, WARM_UP_TOKENS, apply, file_pages, without_page_cache


@pytest.fixture(autouse=True)
def no_termination_message_here(tmp_path, monkeypatch):
    """The fixes report to a container's termination message where there is one: not this machine's /dev."""
    monkeypatch.setattr(vllm_fixes, "REPORT_PATH", str(tmp_path / "no-termination-log"))
    monkeypatch.delenv(vllm_support.REPORT_ENV, raising=False)


V2_STAT = "anon 2147483648\nfile 1610612736\nactive_file 268435456\ninactive_file 1073741824\nshmem 1048576\n"
# v1: the hierarchical totals are read (usage_in_bytes is hierarchical too), never the cgroup's own lines.
V1_STAT = "cache 1\nactive_file 2\ninactive_file 3\ntotal_active_file 268435456\ntotal_inactive_file 1073741824\n"


def cgroup_tree(root: Path, version: int, stat: str | None) -> Path:
    """A container's /sys/fs/cgroup as vLLM reads it: v2 has memory.max at its root, v1 a memory/ directory."""
    stat_dir = root if version == 2 else root / "memory"
    stat_dir.mkdir(parents=True, exist_ok=True)
    if version == 2:
        (root / "memory.max").write_text("3820000000\n")
    if stat is not None:
        (stat_dir / "memory.stat").write_text(stat)
    return root


@pytest.mark.parametrize(
    ("version", "stat", "expected"),
    [
        (2, V2_STAT, 1_342_177_280),
        (1, V1_STAT, 1_342_177_280),
        (2, None, None),  # unreadable: no correction, never a guess
        (2, "anon 1\ninactive_file 5\n", None),  # a kernel without one of the lists
        (1, "total_active_file x\ntotal_inactive_file 1\n", None),
    ],
    ids=["v2", "v1-hierarchical-totals", "no-stat", "missing-key", "garbled"],
)
def test_file_pages_are_the_file_lru_lists(tmp_path, version, stat, expected):
    assert file_pages(cgroup_tree(tmp_path, version, stat)) == expected


@pytest.mark.parametrize(
    ("usage", "stat", "expected"),
    [
        (3 * GIB, V2_STAT, 3 * GIB - 1_342_177_280),
        (None, V2_STAT, None),  # vLLM found no cgroup usage: left so
        (3 * GIB, None, 3 * GIB),  # no page cache figure: vLLM's own
        (GIB, V2_STAT, 0),  # never below zero
    ],
    ids=["less-page-cache", "no-usage", "no-stat", "floor"],
)
def test_usage_less_the_page_cache(tmp_path, usage, stat, expected):
    root = cgroup_tree(tmp_path, 2, stat)
    assert without_page_cache(lambda: usage, root)() == expected


def test_a_correction_is_reported_on_one_line(tmp_path, capsys):
    without_page_cache(lambda: 3 * GIB, cgroup_tree(tmp_path, 2, V2_STAT))()
    assert capsys.readouterr().err == (
        "cpullm-vllm: cgroup usage 3.00 GiB less 1.25 GiB of reclaimable page cache: 1.75 GiB\n"
    )


class Runner:
    """vLLM's CPUModelRunner as the fix sees it: a step size, and a warm-up that reads it."""

    def __init__(self, max_num_tokens: int) -> None:
        self.max_num_tokens = max_num_tokens
        self.warmed_up_with: int | None = None

    def warming_up_model(self) -> None:
        self.warmed_up_with = self.max_num_tokens


@pytest.mark.parametrize(("full", "warm_up"), [(2048, WARM_UP_TOKENS), (8, 8)], ids=["short-step", "already-short"])
def test_the_warm_up_runs_a_short_step_and_the_runner_keeps_its_size(capsys, full, warm_up):
    module = ModuleType("vllm.v1.worker.cpu_model_runner")
    module.CPUModelRunner = type("CPUModelRunner", (Runner,), {})  # type: ignore[attr-defined]
    assert apply(module) is True
    runner = module.CPUModelRunner(full)  # type: ignore[attr-defined]
    runner.warming_up_model()
    assert (runner.warmed_up_with, runner.max_num_tokens) == (warm_up, full)
    assert capsys.readouterr().err == f"cpullm-vllm: warm-up compiles with a {warm_up}-token step, not {full}\n"


def test_a_fix_named_in_the_env_is_left_out(capsys, monkeypatch):
    monkeypatch.setenv("CPULLM_VLLM_FIXES_OFF", "leave_page_cache_out, short_warm_up")
    module = ModuleType("vllm.v1.worker.cpu_model_runner")
    module.CPUModelRunner = type("CPUModelRunner", (Runner,), {})  # type: ignore[attr-defined]
    assert apply(module) is False
    runner = module.CPUModelRunner(2048)  # type: ignore[attr-defined]
    runner.warming_up_model()
    assert runner.warmed_up_with == 2048
    assert capsys.readouterr().err == (
        "cpullm-vllm: vllm.v1.worker.cpu_model_runner: short_warm_up turned off (CPULLM_VLLM_FIXES_OFF)\n"
    )


class Loaded:
    """What torch.compiler.load_compiled_function returns, as vLLM's loader reads it: `_artifacts.compiled_fn`."""

    def __init__(self, compiled_fn: object) -> None:
        self._artifacts = SimpleNamespace(compiled_fn=compiled_fn)


class VllmBackendFunction:
    """vLLM's own backend's function (other platforms), which finalizes its load itself."""

    def __init__(self) -> None:
        self.finalized_with: object = None

    def finalize_loading(self, vllm_config: object) -> None:
        self.finalized_with = vllm_config


def decorators_module(compiled_fn: object) -> ModuleType:
    """vllm.compilation.decorators as fix 4 sees it: its loader of the AOT cache, which finishes the load with
    compiled_fn.finalize_loading as vLLM 0.32's does, and the torch it reaches torch.compiler through."""
    module = ModuleType("vllm.compilation.decorators")
    compiler = SimpleNamespace(load_compiled_function=lambda f, f_globals: Loaded(compiled_fn))
    module.torch = SimpleNamespace(compiler=compiler)  # type: ignore[attr-defined]

    def _try_load_aot_compiled_fn(model: object, path: str) -> object | None:
        try:
            loaded = compiler.load_compiled_function(path, f_globals={})
            loaded._artifacts.compiled_fn.finalize_loading(model)
            return loaded
        except AttributeError:  # vLLM logs the failure and compiles again
            return None

    module._try_load_aot_compiled_fn = _try_load_aot_compiled_fn  # type: ignore[attr-defined]
    return module


def test_the_aot_cache_loads_inductors_function_and_leaves_torch_as_it_was(capsys):
    def inductors_function() -> None:
        """The CPU platform's compiled model: inductor's function, which has no finalize_loading."""

    module = decorators_module(inductors_function)
    load_compiled_function = module.torch.compiler.load_compiled_function  # type: ignore[attr-defined]
    assert module._try_load_aot_compiled_fn("model", "/cache/model") is None  # type: ignore[attr-defined]
    assert apply(module) is True
    loaded = module._try_load_aot_compiled_fn("model", "/cache/model")  # type: ignore[attr-defined]
    assert loaded._artifacts.compiled_fn is inductors_function
    assert module.torch.compiler.load_compiled_function is load_compiled_function  # type: ignore[attr-defined]
    assert capsys.readouterr().err == f"cpullm-vllm: {vllm_fixes.AOT_LOADED}\n"


def test_a_function_that_finalizes_its_own_load_keeps_its_method(capsys):
    compiled = VllmBackendFunction()
    module = decorators_module(compiled)
    assert apply(module) is True
    assert module._try_load_aot_compiled_fn("config", "/cache/model") is not None  # type: ignore[attr-defined]
    assert compiled.finalized_with == "config"
    assert capsys.readouterr().err == ""


class Parallel:
    """vLLM's ParallelConfig as the fix sees it."""

    def __init__(self, ranks: int, backend: str) -> None:
        self.world_size_across_dp, self.distributed_executor_backend = ranks, backend


class Platform:
    """vLLM 0.32's CpuPlatform.check_and_update_config as far as the fix relies on it: it turns the one-process
    executor into the multiprocess one unless VLLM_ENABLE_V1_MULTIPROCESSING is "0", and preloads libgomp."""

    @classmethod
    def check_and_update_config(cls, vllm_config: object) -> None:
        parallel = vllm_config.parallel_config  # type: ignore[attr-defined]
        multiprocess = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"
        if multiprocess and parallel.distributed_executor_backend == "uni":
            parallel.distributed_executor_backend = "mp"
        os.environ["LD_PRELOAD"] = "libgomp.so.1"


def omp_module() -> ModuleType:
    """vllm.utils.ompmultiprocessing: a worker's OpenMP environment, set for the `with` block and then restored."""

    class OMPProcessManager:
        def __init__(self, vllm_config: object) -> None:
            self.gomp = "libgomp" in os.environ.get("LD_PRELOAD", "")

        @contextlib.contextmanager
        def configure_omp_envs(self, rank: int, local_rank: int):  # type: ignore[no-untyped-def]
            chosen = {"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY" if self.gomp else "OMP_PLACES": "0 1"}
            saved = {name: os.environ.get(name) for name in chosen}
            os.environ.update(chosen)
            yield
            for name, value in saved.items():
                os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)

    module = ModuleType("vllm.utils.ompmultiprocessing")
    module.OMPProcessManager = OMPProcessManager  # type: ignore[attr-defined]
    return module


ONE_RANK_ENV = (
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_WORKER_MULTIPROC_METHOD",
    "OMP_NUM_THREADS",
    "GOMP_CPU_AFFINITY",
    "OMP_PLACES",
    "LD_PRELOAD",
    "CPULLM_VLLM_FIXES_OFF",
)


def process_maps(tmp_path: Path, runtime: str) -> Path:
    """A /proc/self/maps whose process loaded the OpenMP runtime `runtime`."""
    maps = tmp_path / "maps"
    maps.write_text(f"7f0000000000-7f0000100000 r-xp 00000000 08:01 42 /opt/venv/lib/{runtime}\n")
    return maps


def checked_by_the_fixed_platform(parallel: Parallel) -> Parallel:
    """The parallel config after vllm.platforms.cpu's check_and_update_config, as the fix patched it, ran on it."""
    module = ModuleType("vllm.platforms.cpu")
    module.CpuPlatform = type("CpuPlatform", (Platform,), {})  # type: ignore[attr-defined]
    assert apply(module) is True
    config = type("VllmConfig", (), {"parallel_config": parallel})()
    module.CpuPlatform.check_and_update_config(config)  # type: ignore[attr-defined]
    return parallel


@pytest.mark.parametrize(
    ("ranks", "backend", "multiprocessing", "executor", "omp_env", "line"),
    [
        (1, "uni", None, "uni", {"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY": "0 1"},
         "one rank runs in the engine core process with GOMP_CPU_AFFINITY=0 1 OMP_NUM_THREADS=2"),
        (1, "uni", "1", "mp", {}, None),  # vLLM's multiprocess executor asked for: left so
        (2, "mp", None, "mp", {}, None),  # more ranks: vLLM's own way
    ],
    ids=["one-rank", "multiprocess-asked-for", "two-ranks"],
)  # fmt: skip
def test_one_rank_runs_in_the_engine_core_with_a_workers_openmp_environment(
    capsys, monkeypatch, tmp_path, ranks, backend, multiprocessing, executor, omp_env, line
):
    for name in ONE_RANK_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(vllm_fixes, "PROCESS_MAPS", process_maps(tmp_path, "libgomp.so.1"))
    if multiprocessing is not None:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", multiprocessing)
    monkeypatch.setitem(sys.modules, "vllm.utils.ompmultiprocessing", omp_module())
    parallel = checked_by_the_fixed_platform(Parallel(ranks, backend))
    assert parallel.distributed_executor_backend == executor
    # What the engine core process inherits: the worker's OpenMP environment, kept after vLLM's `with` restored it.
    assert {name: os.environ[name] for name in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY") if name in os.environ} == (
        omp_env
    )
    assert capsys.readouterr().err == (f"cpullm-vllm: {line}\n" if line else "")


@pytest.mark.parametrize(
    ("runtime", "off", "start_method", "forked"),
    [
        pytest.param("libiomp5.so", "", "fork", True, id="intel-openmp-forked"),
        pytest.param("libgomp.so.1", "", None, False, id="gnu-openmp-spawned"),
        pytest.param("libiomp5.so", "short_warm_up,engine_core_forked", None, False, id="fork-turned-off"),
        pytest.param(None, "", None, False, id="maps-unreadable"),
    ],
)
def test_the_engine_core_is_forked_only_where_intels_openmp_reads_its_environment_late(
    capsys, monkeypatch, tmp_path, runtime, off, start_method, forked
):
    """GNU's OpenMP read its environment as it loaded, in the API server: a forked engine core would keep that."""
    for name in ONE_RANK_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CPULLM_VLLM_FIXES_OFF", off)
    maps = process_maps(tmp_path, runtime) if runtime else tmp_path / "absent"
    monkeypatch.setattr(vllm_fixes, "PROCESS_MAPS", maps)
    monkeypatch.setitem(sys.modules, "vllm.utils.ompmultiprocessing", omp_module())
    assert checked_by_the_fixed_platform(Parallel(1, "uni")).distributed_executor_backend == "uni"
    assert os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == start_method
    line = capsys.readouterr().err
    assert line.startswith("cpullm-vllm: one rank runs in the engine core process")
    assert ("forked from the API server" in line) is forked


def test_without_vllms_openmp_rule_the_rank_stays_in_a_worker(capsys, monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setitem(sys.modules, "vllm.utils.ompmultiprocessing", ModuleType("vllm.utils.ompmultiprocessing"))
    assert checked_by_the_fixed_platform(Parallel(1, "uni")).distributed_executor_backend == "mp"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    assert capsys.readouterr().err == (
        "cpullm-vllm: no vllm.utils.ompmultiprocessing.OMPProcessManager in this vLLM: the rank stays in a worker "
        "process, which the plan's memory limit does not count; set CPULLM_VLLM_FIXES_OFF=rank_in_engine_core in the "
        "service's env for a limit that does\n"
    )


class DefaultModelLoader:
    """vLLM's DefaultModelLoader as fix 5 sees it: load_weights, and the LoadConfig's download_dir."""

    def __init__(self, download_dir: str | None) -> None:
        self.load_config = SimpleNamespace(download_dir=download_dir)
        self.loaded: list[object] = []

    def load_weights(self, model: object, model_config: object) -> None:
        self.loaded.append(model)


def default_loader_module(monkeypatch: pytest.MonkeyPatch, drop: Callable[..., None] | None) -> ModuleType:
    """vllm.model_executor.model_loader.default_loader as fix 5 sees it, and, imported beside it, weight_utils with
    `drop` as its drop_checkpoint_cache (None: a vLLM without one)."""
    utils = ModuleType(vllm_fixes.WEIGHT_UTILS_MODULE)
    if drop is not None:
        utils.drop_checkpoint_cache = drop  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, vllm_fixes.WEIGHT_UTILS_MODULE, utils)
    module = ModuleType("vllm.model_executor.model_loader.default_loader")
    module.DefaultModelLoader = type("DefaultModelLoader", (DefaultModelLoader,), {})  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize(
    ("model", "revision", "download_dir"),
    [("/models/qwen2.5-1.5b", None, None), ("Qwen/Qwen2.5-1.5B", "main", "/models")],
    ids=["local-directory", "hub-id-in-a-download-dir"],
)
def test_the_checkpoints_pages_are_dropped_once_the_weights_are_loaded(
    capsys, monkeypatch, model, revision, download_dir
):
    drops: list[tuple[object, ...]] = []

    def drop_checkpoint_cache(model: str, revision: str | None, cache_dir: str | None) -> None:
        drops.append((model, revision, cache_dir))

    module = default_loader_module(monkeypatch, drop_checkpoint_cache)
    assert apply(module) is True
    loader = module.DefaultModelLoader(download_dir)  # type: ignore[attr-defined]
    loader.load_weights("the model", SimpleNamespace(model=model, revision=revision))
    assert (loader.loaded, drops) == (["the model"], [(model, revision, download_dir)])
    assert capsys.readouterr().err == f"cpullm-vllm: {vllm_fixes.CHECKPOINT_DROPPED}\n"


def test_a_drop_that_fails_leaves_the_loaded_weights_and_says_so(capsys, monkeypatch):
    def drop_checkpoint_cache(model: str, revision: str | None, cache_dir: str | None) -> None:
        raise RuntimeError(f"no snapshot of {model} with token hf_secret")

    module = default_loader_module(monkeypatch, drop_checkpoint_cache)
    assert apply(module) is True
    loader = module.DefaultModelLoader(None)  # type: ignore[attr-defined]
    loader.load_weights("the model", SimpleNamespace(model="org/model", revision=None))
    assert loader.loaded == ["the model"]
    # The exception's kind only: its message may name what it should not.
    assert capsys.readouterr().err == "cpullm-vllm: the checkpoint's page cache left as it is: RuntimeError\n"


def test_a_vllm_without_drop_checkpoint_cache_keeps_its_loader(capsys, monkeypatch):
    module = default_loader_module(monkeypatch, None)
    assert apply(module) is False
    assert module.DefaultModelLoader.load_weights is DefaultModelLoader.load_weights  # type: ignore[attr-defined]
    assert "nothing for checkpoint_pages_dropped to patch" in capsys.readouterr().err


PATCHING_FIXES = [name for name, fix in vllm_fixes.FIXES.items() if fix is not vllm_fixes.amx_tile_permission]


@pytest.mark.parametrize("name", PATCHING_FIXES)
def test_a_vllm_without_what_a_fix_patches_is_left_as_it_is(capsys, name):
    module = ModuleType(name)
    assert apply(module) is False
    assert vars(module).keys() == vars(ModuleType(name)).keys()
    assert capsys.readouterr().err.startswith(f"cpullm-vllm: {name}: nothing for ")


FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/utils/__init__.py": "",
    "vllm/utils/cpu_resource_utils.py": "def get_cgroup_memory_usage():\n    return 4 << 30\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/cpu_model_runner.py": "class CPUModelRunner:\n    def warming_up_model(self):\n        pass\n",
}
PROBE = (
    "import sys; before = 'vllm.utils.cpu_resource_utils' in sys.modules; "
    "from vllm.utils import cpu_resource_utils as u; from vllm.v1.worker import cpu_model_runner as r; "
    "print(before, u.get_cgroup_memory_usage.__name__, r.CPUModelRunner.warming_up_model.__qualname__, "
    "IMAGE_SITE_RAN)"
)
# Where the machine has AMX tiles, the probe also reads its process's permission (ARCH_GET_XCOMP_PERM): bit 18.
AMX_PERMISSION_PROBE = (
    "; import ctypes; mask = ctypes.c_ulong(); ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(mask)); "
    "print(bool(mask.value >> 18 & 1))"
)
# The choice this test makes by the machine's flags: what fix 6 reports, and whether the probe reads the permission.
MACHINE_HAS_AMX = vllm_fixes.AMX_TILE_FLAG in vllm_fixes.cpu_flags()


def test_the_site_directory_patches_vllm_when_imported_and_runs_the_images_own_sitecustomize(tmp_path):
    """As in the pod: the ConfigMap's site directory first on PYTHONPATH, an image whose own sitecustomize sits
    further along it, and a server process that imports vLLM."""
    site, image_site, packages = tmp_path / "site", tmp_path / "image-site", tmp_path / "packages"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SOURCES[SITECUSTOMIZE_FILE])  # as the ConfigMap carries it
    image_site.mkdir()
    (image_site / "sitecustomize.py").write_text("import builtins\nbuiltins.IMAGE_SITE_RAN = True\n")
    for name, text in FAKE_VLLM.items():
        (packages / name).parent.mkdir(parents=True, exist_ok=True)
        (packages / name).write_text(text)
    report = tmp_path / "termination-log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(map(str, (site, image_site, packages))),
        vllm_support.REPORT_ENV: str(report),
    }
    probe = PROBE + (AMX_PERMISSION_PROBE if MACHINE_HAS_AMX else "")
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True, timeout=30
    )
    # Not imported at start-up (a process that never imports vLLM pays nothing), fixed once imported; the image's
    # sitecustomize ran too; on an AMX machine the process holds the AMX tile permission.
    expected = "False usage_the_kernel_cannot_reclaim short_warm_up.<locals>.warming_up_model True\n"
    assert result.stdout == expected + ("True\n" if MACHINE_HAS_AMX else "")
    # And the server's report says so, a line per fix it tried (the fake vLLM has no version: each fix checks),
    # the vllm package's own first.
    amx = "loaded" if MACHINE_HAS_AMX else "not-this-cpu"
    assert report.read_text() == (
        f"cpullm-vllm-fix amx_tile_permission {amx}\n"
        "cpullm-vllm-fix leave_page_cache_out loaded\ncpullm-vllm-fix short_warm_up loaded\n"
    )


@pytest.mark.parametrize(
    ("env", "module", "outcome"),
    [
        ({}, "vllm.utils.cpu_resource_utils", "leave_page_cache_out nothing-to-patch"),
        ({"CPULLM_VLLM_FIXES_OFF": "short_warm_up"}, "vllm.v1.worker.cpu_model_runner", "short_warm_up turned-off"),
    ],
)
def test_each_fix_tried_is_one_line_of_the_report_however_many_processes_try_it(
    tmp_path, monkeypatch, env, module, outcome
):
    report = tmp_path / "termination-log"
    monkeypatch.setenv(vllm_support.REPORT_ENV, str(report))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for _ in range(3):  # the API server, the engine core, a worker
        apply(ModuleType(module))
    assert report.read_text() == f"cpullm-vllm-fix {outcome}\n"


def test_a_fix_not_for_this_vllm_says_so_in_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm_support.REPORT_ENV, str(tmp_path / "report"))
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.30.0"))
    assert apply(ModuleType("vllm.utils.cpu_resource_utils")) is False
    assert vllm_support.read_report((tmp_path / "report").read_text()) == {"leave_page_cache_out": "not-for-this-vllm"}


def test_in_a_container_the_report_is_its_termination_message_and_elsewhere_there_is_none(tmp_path, monkeypatch):
    vllm_fixes.record("short_warm_up", "loaded")  # no termination message file, no REPORT_ENV: nothing written
    assert not (tmp_path / "no-termination-log").exists()
    message = tmp_path / "termination-log"
    message.touch()  # what the kubelet creates in every container
    monkeypatch.setattr(vllm_fixes, "REPORT_PATH", str(message))
    vllm_fixes.record("short_warm_up", "loaded")
    assert message.read_text() == "cpullm-vllm-fix short_warm_up loaded\n"


def test_a_report_that_cannot_be_written_leaves_the_server_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(vllm_support.REPORT_ENV, str(tmp_path / "no-such-dir" / "report"))
    vllm_fixes.record("short_warm_up", "loaded")
    assert "cannot write the fixes' report" in capsys.readouterr().err


def test_every_fix_is_named_where_users_read_how_to_turn_it_off():
    """spec.cpu.launcher's description (the CRD's, kubectl explain's) lists the names CPULLM_VLLM_FIXES_OFF takes."""
    description = CpuSettings.model_fields["launcher"].description or ""
    assert vllm_fixes.OFF_ENV in description
    names = [fix.__name__ for fix in (*vllm_fixes.FIXES.values(), vllm_fixes.engine_core_forked)]
    assert all(name in description for name in names)


CPUINFO_X86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f {extra}\nbugs\t\t: spectre_v1\n"
CPUINFO_ARM64 = "processor\t: 0\nFeatures\t: fp asimd bf16 sve\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    ("cpuinfo", "refused", "asked", "outcome"),
    [
        pytest.param(CPUINFO_X86.format(extra="amx_bf16 amx_tile amx_int8"), 0, True, "loaded", id="AMX"),
        pytest.param(CPUINFO_X86.format(extra="avx512_bf16"), 0, False, "not-this-cpu", id="AVX-512 without AMX"),
        pytest.param(CPUINFO_X86.format(extra=""), 0, False, "not-this-cpu", id="AVX2 only"),
        pytest.param(CPUINFO_ARM64, 0, False, "not-this-cpu", id="arm64"),
        pytest.param(None, 0, False, "not-this-cpu", id="no cpuinfo"),
        pytest.param(CPUINFO_X86.format(extra="amx_tile"), 22, True, "kernel-refused", id="a kernel that refuses"),
    ],
)
def test_the_amx_tile_permission_is_asked_for_exactly_where_the_cpu_has_amx_tiles(
    tmp_path, monkeypatch, capsys, cpuinfo, refused, asked, outcome
):
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    monkeypatch.setattr(vllm_fixes, "CPUINFO", path)
    requests: list[int] = []
    monkeypatch.setattr(vllm_fixes, "request_amx_tile_data", lambda: requests.append(1) or refused)
    report = tmp_path / "report"
    monkeypatch.setenv(vllm_support.REPORT_ENV, str(report))
    assert apply(ModuleType("vllm")) is (outcome == "loaded")
    assert (len(requests), report.read_text()) == (int(asked), f"cpullm-vllm-fix amx_tile_permission {outcome}\n")
    err = capsys.readouterr().err
    assert (vllm_fixes.AMX_PERMITTED in err) is (outcome == "loaded")
    assert ("refused the AMX tile state (errno 22)" in err) is (outcome == "kernel-refused")


def test_the_amx_fix_is_not_asked_for_outside_its_vllm_versions_or_when_turned_off(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_fixes, "request_amx_tile_data", lambda: pytest.fail("asked"))
    monkeypatch.setenv(vllm_support.REPORT_ENV, str(tmp_path / "report"))
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.30.0"))
    assert apply(ModuleType("vllm")) is False
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.32.0"))
    monkeypatch.setenv("CPULLM_VLLM_FIXES_OFF", "amx_tile_permission")
    assert apply(ModuleType("vllm")) is False
    assert vllm_support.read_report((tmp_path / "report").read_text()) == {"amx_tile_permission": "not-for-this-vllm"}


def cgroup_files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


V2_CPU = {
    "cpu.max": "150000 100000\n",
    "cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nnr_periods 40\nnr_throttled 10\nthrottled_usec 500000\n",
    "cpuset.cpus.effective": "2-5\n",
}
V1_CPU = {
    "cpu/cpu.cfs_quota_us": "-1\n",
    "cpu/cpu.cfs_period_us": "100000\n",
    "cpu/cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
    "cpuacct/cpuacct.usage": "7000000000\n",
    "cpuset/cpuset.effective_cpus": "1,3\n",
}


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            V2_CPU,
            {
                vllm_support.CONTAINER_CPUS: 1.5,  # 4 CPUs in its cpuset, a quota of 1.5
                vllm_support.CPU_USAGE_SECONDS: 2.5,
                vllm_support.CPU_PERIODS: 40,
                vllm_support.CPU_THROTTLED_PERIODS: 10,
                vllm_support.CPU_THROTTLED_SECONDS: 0.5,
            },
            id="v2-with-a-quota",
        ),
        pytest.param(
            V1_CPU,
            {
                vllm_support.CONTAINER_CPUS: 2,  # no quota: its cpuset
                vllm_support.CPU_USAGE_SECONDS: 7.0,
                vllm_support.CPU_PERIODS: 0,
                vllm_support.CPU_THROTTLED_PERIODS: 0,
                vllm_support.CPU_THROTTLED_SECONDS: 0.0,
            },
            id="v1-without-a-quota",
        ),
    ],
)
def test_the_containers_cpu_figures_are_read_from_its_cgroup(tmp_path, files, expected):
    assert vllm_fixes.container_cpu(cgroup_files(tmp_path, files)) == pytest.approx(expected)


def test_the_registry_vllm_serves_metrics_from_also_collects_the_containers_cpu(tmp_path, monkeypatch):
    """Fix 7 on a stand-in for vllm.v1.metrics.prometheus: each registry its function returns gets one collector."""
    from prometheus_client import CollectorRegistry, generate_latest

    registries = [CollectorRegistry(), CollectorRegistry()]
    module = ModuleType("vllm.v1.metrics.prometheus")
    module.get_prometheus_registry = lambda: registries[0]  # type: ignore[attr-defined]
    root = cgroup_files(tmp_path, V2_CPU)
    monkeypatch.setattr(vllm_fixes, "CGROUP_ROOT", root)
    monkeypatch.setattr(vllm_fixes.ContainerCpuCollector.__init__, "__defaults__", (root,))
    assert vllm_fixes.container_cpu_metrics(module) == vllm_support.LOADED
    assert module.get_prometheus_registry() is module.get_prometheus_registry()  # registered once
    text = generate_latest(registries[0]).decode()
    assert "cpullm_container_cpus 1.5" in text and "cpullm_container_cpu_throttled_periods_total 10.0" in text
    assert vllm_fixes.container_cpu_metrics(ModuleType("vllm.v1.metrics.prometheus")) == vllm_support.NOTHING_TO_PATCH
