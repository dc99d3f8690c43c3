"""Benchmark, not a test: the rendered vLLM pod at several model sizes, side by side in one run. For each model and
TP it starts the rendered container twice with the same model cache (the second start finds the first's compile
cache there, as a restarted pod on the same node does), splits each start by vLLM's log (testbed/vllm_log.py),
and, between the two, drives a long prompt (the context less 64 tokens, as one prefill) and a full batch
(maxNumSeqs requests at once) while the server's memory cgroup, limited to the plan's limit (or --limit-gib), is
sampled.

    .venv/bin/python bench/sizes_bench.py [--models tiny qwen2.5-0.5b ...] [--tp 1] [--dtype float32]
                                          [--limit-gib N] [--json FILE]

Models: `tiny` (tests/vllm/make_tiny_model.py) and the random-weight models of tests/vllm/make_sized_model.py,
built once and kept under ~/.cache/cpullm-operator/models. Prints, per model and TP: the planned limit and its
parts, each start's split and the compile cache's size, and the peaks of working set and anonymous memory during
the start and during the requests, with each process's anonymous memory at the anonymous peak (what the memory
model's terms stand for: docs/calibration.md). Needs root (cgroups) and the vLLM environment.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.vllm_log import StartSplit, start_split
from testbed.vllm_server import LocalServer, built_model, render_service, server_for_container, vllm_python

SIM_MULTI_NUMA = [{"name": "VLLM_CPU_SIM_MULTI_NUMA", "value": "1"}]
GiB = 2**30


def prompt_ids(count: int, vocab: int, rng: random.Random) -> list[int]:
    """A prompt of exactly `count` tokens (the completions API takes token ids), none of them special."""
    return [rng.randrange(3, vocab) for _ in range(count)]


def requests(server: LocalServer, context: int, seqs: int, vocab: int, timeout: float) -> dict[str, float]:
    """A long prompt alone, then `seqs` requests at once, each given `timeout` seconds; the seconds each took."""
    rng = random.Random(0)
    seconds: dict[str, float] = {}
    started = time.monotonic()
    server.complete(prompt_ids(context - 64, vocab, rng), 32, timeout=timeout)
    seconds["long prompt"] = time.monotonic() - started
    started = time.monotonic()
    with ThreadPoolExecutor(seqs) as pool:
        done = list(pool.map(lambda _: server.complete(prompt_ids(256, vocab, rng), 32, timeout=timeout), range(seqs)))
    assert all(r["usage"]["completion_tokens"] == 32 for r in done)
    seconds["full batch"] = time.monotonic() - started
    return seconds


def start(server: LocalServer) -> StartSplit:
    server.start(timeout=3600)
    assert server.measured.log is not None and server.measured.started_at is not None
    text = server.measured.log.read_text(errors="replace")
    return start_split(text, server.measured.started_at, server.measured.startup_seconds)


def run_case(python: Path, name: str, tp: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    model = built_model(python, name)
    config = json.loads((model / "config.json").read_text())
    context, seqs = args.context, args.seqs
    spec: dict[str, Any] = {"kvCacheGiB": 1, "maxModelLen": context, "maxNumSeqs": seqs}
    if tp > 1:
        spec["env"] = SIM_MULTI_NUMA
    if args.dtype:
        spec["model"] = {"dtype": args.dtype}
    plan, container = render_service(workdir, model, tp, **spec)
    container["env"] += [{"name": k, "value": v} for k, v in (item.split("=", 1) for item in args.env)]
    if args.limit_gib:  # the cgroup's limit; the plan's stays in the tables for comparison
        container["resources"]["limits"]["memory"] = f"{args.limit_gib}Gi"
    case: dict[str, Any] = {"model": name, "tp": tp, "vocab": config["vocab_size"], "plan": plan}
    server = server_for_container(container, workdir=workdir, python=python, model=model, log_name="first.log")
    try:
        case["first"] = asdict(start(server))
        server.mark("start")
        # A request may take a prefill step as long as the plan's step timeout (a 3B model's long prompt took over
        # 600 s on two AVX2 CPUs), then its decode.
        timeout = 2 * plan["stepTimeoutSeconds"]
        case["request_seconds"] = requests(server, context, seqs, config["vocab_size"], timeout)
        server.mark("requests")
    finally:
        server.stop()
    m = server.measured
    case["memory"] = {
        "limit": m.limit_bytes,
        "peak_usage": m.peak_usage_bytes,
        "peak_working_set": m.peak_working_set_bytes,
        "peak_anon": m.peak_anon_bytes,
        "stretches": m.stretches,
        "anon_by_process": m.anon_breakdown,
        "at_working_set_peak": asdict(m.at_peak) if m.at_peak else None,  # anon, shmem, active and inactive file
        "oom_kills": m.oom_kills,
    }
    again = server_for_container(container, workdir=workdir, python=python, model=model, log_name="second.log")
    try:
        case["second"] = asdict(start(again))
    finally:
        again.stop()
    cache = workdir / "models" / "vllm"  # VLLM_CACHE_ROOT as rendered, under the pod's /models
    case["compile_cache_bytes"] = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    return case


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


def split(s: dict[str, Any]) -> str:
    parts = (s["before_load"], s["load"], s["compile_and_warmup"], s["rest"])
    return f"{s['total']:.0f} ({'+'.join(f'{p:.0f}' for p in parts)})"


def print_tables(cases: list[dict[str, Any]]) -> None:
    print("\nstarts: total s (before load + load + compile and warm-up + rest)")
    header = f"{'model':<16}{'TP':>3}  {'shard GiB':>9}  {'first start':<24}{'second start':<24}"
    print(header + f"{'second/first':>12}{'cache MiB':>10}")
    for c in cases:
        ratio = c["second"]["total"] / c["first"]["total"]
        shard, cache = gib(c["plan"]["weightShardBytes"]), c["compile_cache_bytes"] / 2**20
        first, second = split(c["first"]), split(c["second"])
        print(f"{c['model']:<16}{c['tp']:>3}  {shard:>9}  {first:<24}{second:<24}{ratio:>12.2f}{cache:>10.1f}")
    print("\nmemory cgroup, GiB (plan: the plan's limit; limit: the cgroup's, the plan's unless --limit-gib;")
    print("WS: working set; start / requests: peaks in each stretch; WS/plan: the working set's peak over the plan's)")
    header = f"{'model':<16}{'TP':>3}{'vocab':>8}{'plan':>7}{'limit':>7}{'WS start':>9}{'WS req':>8}{'anon start':>11}"
    print(header + f"{'anon req':>9}{'WS/plan':>9}{'OOM':>4}  anon by process at its peak")
    for c in cases:
        m, planned = c["memory"], c["plan"]["memoryLimitBytes"]
        (ws_start, anon_start), (ws_req, anon_req) = m["stretches"]["start"], m["stretches"]["requests"]
        by_process = ", ".join(f"{n} {gib(b)}" for n, b in m["anon_by_process"])
        print(
            f"{c['model']:<16}{c['tp']:>3}{c['vocab']:>8}{gib(planned):>7}{gib(m['limit']):>7}{gib(ws_start):>9}"
            f"{gib(ws_req):>8}{gib(anon_start):>11}{gib(anon_req):>9}{m['peak_working_set'] / planned:>9.3f}"
            f"{m['oom_kills']:>4}"
            f"  {by_process}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "qwen2.5-0.5b"])
    parser.add_argument("--tp", nargs="+", type=int, default=[1])
    parser.add_argument("--context", type=int, default=2048, help="maxModelLen (default 2048)")
    parser.add_argument("--seqs", type=int, default=8, help="maxNumSeqs (default 8)")
    parser.add_argument("--dtype", help="spec.model.dtype (default: the spec's, bfloat16)")
    parser.add_argument(
        "--limit-gib", type=int, help="run under this memory limit, not the plan's (to measure what a plan lacks)"
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="add to the rendered env (alternatives)"
    )
    args = parser.parse_args()
    python = vllm_python()
    cases = []
    tmp = Path(tempfile.mkdtemp(prefix="cpullm-sizes-"))  # kept: each case's logs and compile cache
    for name in args.models:
        for tp in args.tp:
            workdir = tmp / f"{name}-tp{tp}"
            workdir.mkdir()
            cases.append(run_case(python, name, tp, args, workdir))
            print(f"sizes_bench: {name} TP {tp} done", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(cases, indent=1, default=str))
    print_tables(cases)
    print(f"\nlogs: {tmp}")


if __name__ == "__main__":
    main()
