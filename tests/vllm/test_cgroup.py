"""The memory cgroup the real-vLLM tests run their server in (testbed/cgroup.py): finding the memory
hierarchy (v1, v2, hybrid, inside a container), reading it as the kubelet does, and, where this machine allows
it (root), a real cgroup that charges a child's memory and counts the kernel's OOM kill. Not marked `vllm`:
it runs with the unit tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from testbed.cgroup import CgroupUnavailable, MemoryCgroup, find_hierarchy

MiB = 2**20


def fake_proc(tmp_path: Path, mountinfo: str, cgroup: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


def test_v1_memory_hierarchy_is_found_on_a_hybrid_host_with_the_process_own_cgroup(tmp_path: Path):
    sys_fs = tmp_path / "cgroup"
    (sys_fs / "memory" / "job" / "abc").mkdir(parents=True)
    (sys_fs / "unified").mkdir()
    (sys_fs / "unified" / "cgroup.controllers").write_text("hugetlb\n")  # memory is bound to v1
    mountinfo = (
        f"31 23 0:28 / {sys_fs} rw - tmpfs tmpfs rw\n"
        f"32 31 0:29 / {sys_fs}/cpu rw - cgroup cgroup rw,cpu\n"
        f"35 31 0:32 / {sys_fs}/memory rw,relatime - cgroup cgroup rw,memory\n"
        f"41 31 0:38 / {sys_fs}/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    proc = fake_proc(tmp_path, mountinfo, "4:memory:/job/abc\n1:cpu:/\n0::/\n")
    hierarchy = find_hierarchy(proc)
    assert (hierarchy.version, hierarchy.mount, hierarchy.own) == (1, sys_fs / "memory", sys_fs / "memory/job/abc")


def test_v2_hierarchy_and_a_container_mount_whose_root_is_its_own_cgroup(tmp_path: Path):
    mount = tmp_path / "cgroup"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    mountinfo = f"40 30 0:26 /kubepods/pod1 {mount} rw - cgroup2 cgroup2 rw,nsdelegate\n"
    proc = fake_proc(tmp_path, mountinfo, "0::/kubepods/pod1\n")
    hierarchy = find_hierarchy(proc)
    assert (hierarchy.version, hierarchy.mount, hierarchy.own) == (2, mount, mount)


def test_no_memory_controller_is_a_clear_error(tmp_path: Path):
    (tmp_path / "cgroup").mkdir()
    (tmp_path / "cgroup" / "cgroup.controllers").write_text("cpu pids\n")
    proc = fake_proc(tmp_path, f"40 30 0:26 / {tmp_path}/cgroup rw - cgroup2 cgroup2 rw\n", "0::/\n")
    with pytest.raises(CgroupUnavailable, match="no memory cgroup controller"):
        find_hierarchy(proc)


@pytest.mark.parametrize(
    ("version", "files"),
    [
        (
            1,
            {
                "memory.limit_in_bytes": "9223372036854771712\n",
                "memory.usage_in_bytes": "500\n",
                "memory.max_usage_in_bytes": "900\n",
                "memory.stat": (
                    "cache 300\nrss 1\ninactive_file 7\ntotal_cache 300\ntotal_rss 200\ntotal_shmem 50\n"
                    "total_active_file 100\ntotal_inactive_file 120\n"
                ),
                "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
            },
        ),
        (
            2,
            {
                "memory.max": "max\n",
                "memory.current": "500\n",
                "memory.peak": "900\n",
                "memory.stat": "anon 200\nfile 270\nshmem 50\nactive_file 100\ninactive_file 120\n",
                "memory.events": "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n",
            },
        ),
    ],
)
def test_readings_use_the_kubelets_definitions(tmp_path: Path, version: int, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cgroup = MemoryCgroup(tmp_path, version)
    reading = cgroup.reading()
    assert (reading.usage, reading.inactive_file, reading.working_set) == (500, 120, 380)
    assert (reading.anon, reading.shmem, reading.active_file, reading.other) == (200, 50, 100, 30)
    assert (cgroup.limit(), cgroup.kernel_peak(), cgroup.oom_kills()) == (None, 900, 2)


def test_v2_without_memory_peak_has_no_kernel_peak(tmp_path: Path):
    (tmp_path / "memory.max").write_text("1048576\n")
    cgroup = MemoryCgroup(tmp_path, 2)
    assert (cgroup.limit(), cgroup.kernel_peak()) == (1048576, None)


def real_cgroup(name: str, limit: int) -> MemoryCgroup:
    try:
        return MemoryCgroup.create(f"cpullm-test-{os.getpid()}-{name}", limit)
    except CgroupUnavailable as error:
        pytest.skip(f"no memory cgroup can be made here: {error}")


def run_in(cgroup: MemoryCgroup, allocate_mib: int) -> subprocess.CompletedProcess[bytes]:
    """A child that touches `allocate_mib` MiB of anonymous memory, in the cgroup before it execs."""
    code = f"b = bytearray({allocate_mib} * 2**20); b[::4096] = b'x' * len(b[::4096])"
    return subprocess.run([sys.executable, "-c", code], preexec_fn=cgroup.join, check=False, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a real memory cgroup (root)")
def test_a_real_cgroup_charges_the_child_and_is_removed():
    cgroup = real_cgroup("charge", 512 * MiB)
    try:
        assert cgroup.limit() == 512 * MiB
        assert run_in(cgroup, 200).returncode == 0
        peak = cgroup.kernel_peak()
        assert peak is None or peak >= 200 * MiB
        assert cgroup.oom_kills() == 0 and cgroup.pids() == []
    finally:
        cgroup.remove()
    assert not cgroup.path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a real memory cgroup (root)")
def test_a_real_cgroup_counts_the_oom_kill_of_a_child_above_its_limit():
    cgroup = real_cgroup("oom", 64 * MiB)
    try:
        result = run_in(cgroup, 256)
        assert result.returncode == -9
        assert cgroup.oom_kills() == 1
    finally:
        cgroup.remove()
