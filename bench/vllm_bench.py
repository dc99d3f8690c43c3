"""Benchmark, not a test: the operator-rendered vLLM pod (through the in-pod launcher) against the same pod
with vLLM's own 'auto' binding (spec.cpu.launcher: false) and against a hand-tuned `vllm serve` (explicit
per-rank CPU lists, tcmalloc and Intel OpenMP preloaded, the same KV cache), side by side in one run, for TP=1
and TP=2 on this machine (TP=2 as two simulated NUMA nodes, as in the tests).

    .venv/bin/python bench/vllm_bench.py [--tokens 64] [--batch 8] [--tp 1 2] [--rounds 2]

Prints startup seconds, decode tokens/s for one stream and for a batch (best of --rounds), the binding each
configuration ran with, and the peak working set of the server's memory cgroup (testbed/vllm_server.py; needs
root) against the planned container memory limit (the rendered pods run under it; the hand-tuned one unlimited).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.vllm_server import (
    PROMPTS,
    LocalServer,
    free_port,
    make_tiny_model,
    render_service,
    server_for_container,
    vllm_python,
)

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
SIM_MULTI_NUMA = [{"name": "VLLM_CPU_SIM_MULTI_NUMA", "value": "1"}]


@dataclass
class Row:
    name: str
    result: dict[str, Any]
    limit: int | None


def hand_tuned(python: Path, model: Path, tp: int, port: int, log: Path) -> LocalServer:
    """What a person who knows vLLM's CPU backend would run by hand on this machine: explicit CPU lists (one
    rank per half of the CPUs at TP=2), tcmalloc and Intel OpenMP preloaded, the tests' KV cache and limits."""
    cpus = sorted(os.sched_getaffinity(0))
    per_rank = [cpus[i * len(cpus) // tp : (i + 1) * len(cpus) // tp] for i in range(tp)]
    bind = "|".join(",".join(map(str, rank)) for rank in per_rank)
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port)]
    command += ["--dtype", "bfloat16", "--tensor-parallel-size", str(tp), "--max-model-len", "1024"]
    command += ["--max-num-seqs", "8"] + (["--distributed-executor-backend", "mp"] if tp > 1 else [])
    preload = [TCMALLOC, str(python.parent.parent / "lib" / "libiomp5.so")]
    env = {
        "PATH": f"{python.parent}:/usr/bin:/bin",
        "HOME": str(Path.home()),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "LD_PRELOAD": ":".join(p for p in preload if Path(p).exists()),
    }
    return LocalServer(command=command, env=env, port=port, log=log)


def root_cause(log: Path) -> str:
    """The first exception message in a vLLM log (the worker's, not the engine's wrapper)."""
    for line in log.read_text(errors="replace").splitlines():
        match = re.search(r"\b(\w+Error: .*)", line)
        if match and " ERROR " in line and "Engine core initialization failed" not in match.group(1):
            return match.group(1)[:160]
    return "failed to start (see the log)"


def binding(log: Path) -> str:
    """The CPU lists vLLM says it bound its ranks to (its own 'OpenMP thread binding info' lines)."""
    ranks = re.findall(r"local_rank=(\d+), core ids=\[([^\]]*)\]", log.read_text(errors="replace"))
    return "|".join(ids.replace(" ", "") for _, ids in sorted(set(ranks))) or "?"


def measure(server: LocalServer, tokens: int, batch: int, rounds: int) -> dict[str, Any]:
    try:
        server.start(timeout=900)
    except (RuntimeError, TimeoutError):
        server.stop()
        return {"error": root_cause(server.log)}
    try:
        server.complete(PROMPTS[0], max_tokens=4)  # warm-up
        single_rate = batch_rate = 0.0
        for _ in range(rounds):
            started = time.monotonic()
            single = server.complete(PROMPTS[0], max_tokens=tokens)["usage"]["completion_tokens"]
            single_rate = max(single_rate, single / (time.monotonic() - started))
            started = time.monotonic()
            many = server.complete(PROMPTS[:batch], max_tokens=tokens)["usage"]["completion_tokens"]
            batch_rate = max(batch_rate, many / (time.monotonic() - started))
    finally:
        server.stop()
    return {
        "startup": server.measured.startup_seconds,
        "single": single_rate,
        "batch": batch_rate,
        "peak": server.measured.peak_working_set_bytes,
        "bind": binding(server.log),
    }


def rendered(workdir: Path, python: Path, model: Path, tp: int, name: str, **spec: Any) -> tuple[LocalServer, int]:
    sub = workdir / name
    sub.mkdir()
    plan, container = render_service(sub, model, tp, maxNumSeqs=8, env=SIM_MULTI_NUMA if tp == 2 else [], **spec)
    server = server_for_container(container, workdir=sub, python=python, model=model)
    return server, int(plan["memoryLimitBytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="measurements per server; the best is kept")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    python = vllm_python()
    workdir = Path(tempfile.mkdtemp(prefix="cpullm-bench-"))
    model = make_tiny_model(python, workdir / "tiny-llama")
    rows: list[Row] = []
    for tp in args.tp:
        server, limit = rendered(workdir, python, model, tp, f"launcher-tp{tp}")
        rows.append(Row(f"TP={tp} rendered, launcher", measure(server, args.tokens, args.batch, args.rounds), limit))
        server, limit = rendered(workdir, python, model, tp, f"auto-tp{tp}", cpu={"launcher": False})
        rows.append(Row(f"TP={tp} rendered, vLLM auto", measure(server, args.tokens, args.batch, args.rounds), limit))
        server = hand_tuned(python, model, tp, free_port(), workdir / f"hand-tp{tp}.log")
        rows.append(Row(f"TP={tp} hand-tuned serve", measure(server, args.tokens, args.batch, args.rounds), None))

    cpus = len(os.sched_getaffinity(0))
    print(f"\nvllm-cpu 0.32.0, tiny Llama (hidden 256, 4 layers), {cpus} CPUs, {args.tokens} tokens, ", end="")
    print(f"batch of {args.batch}, best of {args.rounds}; logs: {workdir}")
    columns = ("configuration", "bind", "startup s", "1-stream tok/s", "batch tok/s", "peak WS GiB", "ratio")
    widths = (28, 9, 9, 14, 11, 12, 6)
    header = " ".join(
        f"{c:<{w}}" if i < 2 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(columns, widths, strict=True))
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        result = row.result
        if "error" in result:
            print(f"{row.name:<28} did not start: {result['error']}")
            continue
        ratio = f"{result['peak'] / row.limit:.3f}" if row.limit else "-"
        print(
            f"{row.name:<28} {result['bind']:<9} {result['startup']:>9.1f} {result['single']:>14.1f} "
            f"{result['batch']:>11.1f} {result['peak'] / 2**30:>12.2f} {ratio:>6}"
        )


if __name__ == "__main__":
    main()
