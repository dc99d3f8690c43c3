"""Benchmark, not a test: the two placements side by side in one run, on this machine described as two NUMA
nodes of one CPU each (as the tests do, with VLLM_CPU_SIM_MULTI_NUMA for TP=2):

- tensorParallel: one server, TP=2, one rank per CPU;
- throughput: two TP=1 servers, each started inside its own one-CPU cpuset (`taskset`, as the kubelet's static
  CPU manager would give each pod), requests spread over both as a Service would.

    .venv/bin/python bench/placement_bench.py [--tokens 64] [--batch 8] [--rounds 2]

Prints single-stream tokens/s and latency (one request, one server) and aggregate batch tokens/s (the batch
split evenly over the servers and sent at once), best of --rounds, both rendered by `cpullm render`. Needs root:
each server runs in a memory cgroup of its own under its pod's limit (testbed/vllm_server.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.vllm_server import (
    PROMPTS,
    LocalServer,
    make_tiny_model,
    render_service,
    server_for_container,
    vllm_python,
)

SIM_MULTI_NUMA = [{"name": "VLLM_CPU_SIM_MULTI_NUMA", "value": "1"}]


def servers(workdir: Path, python: Path, model: Path, placement: str) -> tuple[dict[str, Any], list[LocalServer]]:
    sub = workdir / placement
    sub.mkdir()
    env = SIM_MULTI_NUMA if placement == "tensorParallel" else []
    plan, container = render_service(sub, model, 2, maxNumSeqs=8, placement=placement, replicas=2, env=env)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    cpusets = [()] if placement == "tensorParallel" else [("taskset", "-c", str(cpu)) for cpu in cpus]
    started = [
        server_for_container(
            container, workdir=sub, python=python, model=model, log_name=f"vllm-{i}.log", taskset=cpuset
        )
        for i, cpuset in enumerate(cpusets)
    ]
    return plan, started


def measure(group: list[LocalServer], tokens: int, batch: int, rounds: int) -> dict[str, float]:
    for server in group:
        server.start(timeout=900)
    try:
        for server in group:
            server.complete(PROMPTS[0], max_tokens=4)  # warm-up
        single = latency = aggregate = 0.0
        for _ in range(rounds):
            started = time.monotonic()
            made = group[0].complete(PROMPTS[0], max_tokens=tokens)["usage"]["completion_tokens"]
            elapsed = time.monotonic() - started
            if made / elapsed > single:
                single, latency = made / elapsed, elapsed
            shares = [PROMPTS[i :: len(group)][: batch // len(group)] for i in range(len(group))]
            started = time.monotonic()
            with ThreadPoolExecutor(len(group)) as pool:
                requests = [
                    pool.submit(server.complete, share, tokens) for server, share in zip(group, shares, strict=True)
                ]
                results = [request.result() for request in requests]
            total = sum(r["usage"]["completion_tokens"] for r in results)
            aggregate = max(aggregate, total / (time.monotonic() - started))
    finally:
        for server in group:
            server.stop()
    return {
        "startup": max(s.measured.startup_seconds for s in group),
        "single": single,
        "latency": latency,
        "batch": aggregate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two CPUs")
    python = vllm_python()
    workdir = Path(tempfile.mkdtemp(prefix="cpullm-placement-bench-"))
    model = make_tiny_model(python, workdir / "tiny-llama")
    rows = []
    for placement in ("tensorParallel", "throughput"):
        plan, group = servers(workdir, python, model, placement)
        rows.append((placement, plan, measure(group, args.tokens, args.batch, args.rounds)))

    print(
        f"\nvllm-cpu 0.32.0, tiny Llama, 2 CPUs as 2 NUMA nodes, {args.tokens} tokens, batch of {args.batch}, ", end=""
    )
    print(f"best of {args.rounds}; logs: {workdir}")
    header = f"{'placement':<16} {'servers':>7} {'TP':>3} {'startup s':>9} {'1-stream tok/s':>14} {'latency s':>9} "
    header += f"{'batch tok/s':>11}"
    print(header)
    print("-" * len(header))
    for placement, plan, result in rows:
        count = 1 if placement == "tensorParallel" else plan["replicas"]
        print(
            f"{placement:<16} {count:>7} {plan['tensorParallelSize']:>3} {result['startup']:>9.1f} "
            f"{result['single']:>14.1f} {result['latency']:>9.2f} {result['batch']:>11.1f}"
        )


if __name__ == "__main__":
    main()
