"""Benchmark, not a test: the operator-rendered vLLM configuration against plain `vllm serve` with vLLM's
defaults, side by side, for TP=1 and TP=2 on this machine (TP=2 as two simulated NUMA nodes, as in the tests).

    .venv/bin/python bench/vllm_bench.py [--tokens 64] [--batch 8]

Prints startup seconds, decode tokens/s for one stream and for a batch, and peak RSS of the process tree
against the planned container memory limit.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.vllm.harness import LocalServer, free_port, render_tiny_service, server_for_container, vllm_python

PROMPTS = [
    "The quick brown fox",
    "Kubernetes schedules pods",
    "Each tensor parallel rank",
    "Once upon a time",
    "Large language models",
    "Memory placement",
    "Thread binding",
    "The lazy dog",
]


def plain(python: Path, model: Path, tp: int, port: int, log: Path) -> LocalServer:
    """`vllm serve` with vLLM's defaults: no VLLM_CPU_* settings, no memory or thread planning."""
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(tp),
    ]
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(Path.home())}
    if tp == 2:
        env["VLLM_CPU_SIM_MULTI_NUMA"] = "1"  # the same simulated 2-NUMA machine as the rendered run
    return LocalServer(command=command, env=env, port=port, log=log)


def root_cause(log: Path) -> str:
    """The first exception message in a vLLM log (the worker's, not the engine's wrapper)."""
    for line in log.read_text(errors="replace").splitlines():
        match = re.search(r"\b(\w+Error: .*)", line)
        if match and " ERROR " in line and "Engine core initialization failed" not in match.group(1):
            return match.group(1)[:160]
    return "failed to start (see the log)"


def measure(server: LocalServer, tokens: int, batch: int) -> dict[str, Any]:
    try:
        server.start(timeout=600)
    except (RuntimeError, TimeoutError):
        server.stop()
        return {"error": root_cause(server.log)}
    try:
        server.complete(PROMPTS[0], max_tokens=4)  # warm-up
        started = time.monotonic()
        single = server.complete(PROMPTS[0], max_tokens=tokens)["usage"]["completion_tokens"]
        single_rate = single / (time.monotonic() - started)
        started = time.monotonic()
        many = server.complete(PROMPTS[:batch], max_tokens=tokens)["usage"]["completion_tokens"]
        batch_rate = many / (time.monotonic() - started)
    finally:
        server.stop()
    return {
        "startup": server.measured.startup_seconds,
        "single": single_rate,
        "batch": batch_rate,
        "peak": server.measured.peak_rss_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    python = vllm_python()
    workdir = Path(tempfile.mkdtemp(prefix="cpullm-bench-"))
    model = workdir / "tiny-llama"
    subprocess.run(
        [str(python), str(Path(__file__).resolve().parents[1] / "tests/vllm/make_tiny_model.py"), str(model)],
        check=True,
    )
    rows = []
    for tp in (1, 2):
        env = [{"name": "VLLM_CPU_SIM_MULTI_NUMA", "value": "1"}] if tp == 2 else []
        plan, container = render_tiny_service(workdir, model, tp, maxNumSeqs=8, env=env)
        limit = plan["memoryLimitBytes"]
        ours = server_for_container(
            container,
            python=python,
            model=model,
            port=free_port(),
            log=workdir / f"rendered-tp{tp}.log",
            mounts={"/models": workdir / "models"},
        )
        rows.append((f"TP={tp} operator-rendered", measure(ours, args.tokens, args.batch), limit))
        theirs = plain(python, model, tp, free_port(), workdir / f"plain-tp{tp}.log")
        rows.append((f"TP={tp} plain vllm serve", measure(theirs, args.tokens, args.batch), None))

    print(f"\nvllm-cpu 0.32.0, tiny Llama (hidden 256, 4 layers), {args.tokens} tokens, batch of {args.batch}")
    print(f"logs: {workdir}")
    columns = ("configuration", "startup s", "1-stream tok/s", "batch tok/s", "peak RSS GiB", "limit GiB", "ratio")
    widths = (28, 9, 14, 11, 12, 9, 6)
    header = " ".join(
        f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(columns, widths, strict=True))
    )
    print(header)
    print("-" * len(header))
    for name, result, limit in rows:
        if "error" in result:
            print(f"{name:<28} did not start: {result['error']}")
            continue
        ratio = f"{result['peak'] / limit:.3f}" if limit else "-"
        limit_text = f"{limit / 2**30:.2f}" if limit else "none"
        print(
            f"{name:<28} {result['startup']:>9.1f} {result['single']:>14.1f} {result['batch']:>11.1f} "
            f"{result['peak'] / 2**30:>12.2f} {limit_text:>9} {ratio:>6}"
        )


if __name__ == "__main__":
    main()
