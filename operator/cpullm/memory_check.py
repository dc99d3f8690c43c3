"""Makes vLLM's memory checks count what the kernel cannot reclaim. Shipped into the vLLM container as
`sitecustomize.py` (core/children/launcher.py); the in-pod launcher puts its directory first on the server's
PYTHONPATH, so every Python process of the server (the API server, the engine core, the workers vLLM spawns)
runs it at start-up.

Why: before it allocates the KV cache, vLLM 0.32's CPU worker requires the container's memory limit less its
usage to hold the cache (`cpu_worker.determine_available_memory` through
`cpu_resource_utils.get_memory_node_info`, which clamps to the cgroup since vllm PR 45086), and the usage it
reads (`memory.current`, v1 `memory.usage_in_bytes`) counts page cache: the image's libraries and the model's
files, charged to the container that first reads (or downloads) them. A pod that is the first on its node to
read them therefore failed its first start ("Available memory on node 0 (0.11/3.56 GiB) on kv cache allocation
is less than requested memory for kv (1.0 GiB)", docs/calibration.md) and started after a restart, in a new
cgroup that those pages are no longer charged to. Those pages are the kernel's to reclaim when the cache is
allocated; what cannot be reclaimed is the rest: anonymous memory, shmem (/dev/shm) and kernel memory.

So vLLM's `get_cgroup_memory_usage` is wrapped to return usage less the cgroup's file LRU pages (memory.stat
`active_file` + `inactive_file`; v1 `total_active_file` + `total_inactive_file`, hierarchical as its usage is).
Every vLLM reader of that function sees it (the KV check, the weight loader's prefetch choice). It is patched
when vLLM imports the module, through an import hook: a process that never imports vLLM pays nothing, and a
vLLM without that function is left as it is, with one line on stderr saying so.

This file imports the standard library only, like the launcher.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

PATCHED_MODULE = "vllm.utils.cpu_resource_utils"
PATCHED_FUNCTION = "get_cgroup_memory_usage"
CGROUP_ROOT = Path("/sys/fs/cgroup")
GIB = 1 << 30
# What starts each line this module writes on stderr (the tests find the corrections in the server's log by it).
LOG_PREFIX = "cpullm-memory:"
# memory.stat keys of the file LRU lists, by where vLLM reads usage from (the same test as vLLM's: v2 when
# memory.max exists at the mount's root).
FILE_PAGES_V2 = ("active_file", "inactive_file")
FILE_PAGES_V1 = ("total_active_file", "total_inactive_file")


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
        print(
            f"{LOG_PREFIX} cgroup usage {usage / GIB:.2f} GiB less {cache / GIB:.2f} GiB of reclaimable page "
            f"cache: {corrected / GIB:.2f} GiB",
            file=sys.stderr,
            flush=True,
        )
        return corrected

    return usage_the_kernel_cannot_reclaim


def patch(module: ModuleType) -> bool:
    """Wrap the module's usage reader; False (and one line on stderr) when this vLLM has none."""
    original = getattr(module, PATCHED_FUNCTION, None)
    if not callable(original):
        print(
            f"{LOG_PREFIX} {module.__name__}.{PATCHED_FUNCTION} not found; vLLM's memory checks are left as they "
            "are (they count reclaimable page cache as used)",
            file=sys.stderr,
            flush=True,
        )
        return False
    setattr(module, PATCHED_FUNCTION, without_page_cache(original))
    return True


class _PatchingLoader(importlib.abc.Loader):
    """Runs the module's own loader, then patches it."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        patch(module)

    def __getattr__(self, name: str) -> Any:
        """The rest (get_source for tracebacks, get_code, is_package) is the module's own loader's."""
        return getattr(self._loader, name)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds PATCHED_MODULE as the path finder would, with a loader that patches it once it has run."""

    def __init__(self, target: str = PATCHED_MODULE) -> None:
        self.target = target

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader)
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
    if not any(isinstance(finder, PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, PatchOnImport())


if __name__ == "sitecustomize":
    install()
    run_shadowed_sitecustomize(Path(__file__).resolve().parent)
