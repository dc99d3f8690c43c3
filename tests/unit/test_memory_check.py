"""vLLM's memory check correction (cpullm/memory_check.py): the page cache read from recorded cgroup files, the
wrapped usage reader, and the import hook as the server's Python processes run it (a fake `vllm` package)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from cpullm import memory_check
from cpullm.memory_check import GIB, file_pages, patch, without_page_cache

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
        "cpullm-memory: cgroup usage 3.00 GiB less 1.25 GiB of reclaimable page cache: 1.75 GiB\n"
    )


def test_a_vllm_without_the_reader_is_left_as_it_is(capsys):
    module = ModuleType("vllm.utils.cpu_resource_utils")
    assert patch(module) is False
    assert not hasattr(module, "get_cgroup_memory_usage")
    assert "get_cgroup_memory_usage not found" in capsys.readouterr().err


FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/utils/__init__.py": "",
    "vllm/utils/cpu_resource_utils.py": textwrap.dedent(
        """
        def get_cgroup_memory_usage():
            return 4 << 30
        """
    ),
}
PROBE = (
    "import sys; before = 'vllm.utils.cpu_resource_utils' in sys.modules; "
    "from vllm.utils import cpu_resource_utils as u; "
    "print(before, u.get_cgroup_memory_usage.__name__, IMAGE_SITE_RAN)"
)


def test_the_site_directory_patches_vllm_when_imported_and_runs_the_images_own_sitecustomize(tmp_path):
    """As in the pod: the ConfigMap's site directory first on PYTHONPATH, an image whose own sitecustomize sits
    further along it, and a server process that imports vLLM."""
    site, image_site, packages = tmp_path / "site", tmp_path / "image-site", tmp_path / "packages"
    site.mkdir()
    (site / "sitecustomize.py").write_text(Path(memory_check.__file__).read_text())
    image_site.mkdir()
    (image_site / "sitecustomize.py").write_text("import builtins\nbuiltins.IMAGE_SITE_RAN = True\n")
    for name, text in FAKE_VLLM.items():
        (packages / name).parent.mkdir(parents=True, exist_ok=True)
        (packages / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (site, image_site, packages)))}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True, timeout=30
    )
    # Not imported at start-up (a process that never imports vLLM pays nothing), wrapped once it is; the image's
    # sitecustomize ran too.
    assert result.stdout == "False usage_the_kernel_cannot_reclaim True\n"
