"""The launcher on this machine's real procfs/sysfs: pinned to one CPU by taskset, it must bind exactly that CPU.

Expected values come from /proc and /sys at test time, so the test holds on any Linux machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpullm import launcher

NODE_DIR = Path("/sys/devices/system/node")
PRINT_KNOBS = "import os; print(os.environ['VLLM_CPU_OMP_THREADS_BIND'], os.environ['CPU_VISIBLE_MEMORY_NODES'])"


def numa_node_of(cpu: int) -> int:
    """The node whose cpulist holds `cpu`; 0 on kernels without NUMA sysfs (as the launcher assumes)."""
    for cpulist in NODE_DIR.glob("node[0-9]*/cpulist"):
        if cpu in launcher.parse_cpu_list(cpulist.read_text()):
            return int(cpulist.parent.name.removeprefix("node"))
    return 0


def allowed_memory_nodes() -> frozenset[int]:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Mems_allowed_list:"):
            return launcher.parse_cpu_list(line.partition(":")[2])
    raise AssertionError("no Mems_allowed_list in /proc/self/status")


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux procfs/sysfs")
def test_launcher_binds_the_one_cpu_taskset_allows():
    cpu = max(os.sched_getaffinity(0))
    node = numa_node_of(cpu)
    mems = allowed_memory_nodes()
    # The node the CPU is on, unless this cgroup keeps memory elsewhere: then vLLM gets the allowed nodes.
    expected_nodes = str(node) if node in mems else ",".join(map(str, sorted(mems)))
    env = {name: value for name, value in os.environ.items() if name != "VLLM_CPU_SIM_MULTI_NUMA"}
    launch = [sys.executable, launcher.__file__, "--ranks", "1", "--reserved-cpus-per-rank", "0"]
    result = subprocess.run(
        ["taskset", "-c", str(cpu), *launch, "--", sys.executable, "-c", PRINT_KNOBS],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    assert result.stdout.split() == [str(cpu), expected_nodes]
    assert result.stderr.startswith(f"cpullm-launch: saw cpuset {cpu} ")
