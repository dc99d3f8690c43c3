"""Benchmark, not a test: how near the memory roofline the rendered vLLM pod decodes, against the alternatives that
matter, side by side in one run on this machine.

Decode on a CPU is memory-bound: a step of one sequence streams the rank's weights once, so tokens/s x weight
bytes is the bandwidth decode reached. The roofline is the bandwidth the rank's threads get, measured here first
(bench/roofline_probe.py, in the vLLM environment): a streaming read, and a bf16 GEMV of the model's own shapes
(one decode step's matrix-vector products). Then each configuration is started as a server (the rendered
container as a local process, testbed/vllm_server.py) and one sequence's decode rate is measured from two
completions of different lengths (their difference cancels prefill and request overheads).

    .venv/bin/python bench/roofline_bench.py [--model qwen2.5-1.5b] [--rounds 3] [--only rendered eager ...]

Configurations: the rendered pod (launcher binding), the same with one CPU kept for the API server and engine
core (cpu.reservedCpusPerRank 1), fewer OpenMP threads than CPUs (nobind, OMP_NUM_THREADS 1), glibc's allocator
instead of tcmalloc (LD_PRELOAD without it), no torch.compile (--enforce-eager: a start without compilation or
warm-up), a smaller prefill step (--max-num-batched-tokens 512: a quarter of the start's warm-up prefill), the
rank in a worker process of its own as vLLM starts it (the launcher's fix that runs it in the engine core off), and
float32 weights (model.dtype: twice the bytes per token, no bf16 widened before each multiply-add). SMT
siblings are compared where the CPUs have them. Each row also gives the server's start, one 1,024-token prompt's
prefill rate, and the peak working set of its memory cgroup against the plan's limit. Each row's ratios divide by
the roofline measured again right after its decode (the server idle): on a shared machine the bandwidth moves
between rows minutes apart. A configuration whose server exits before it answers is listed under the table with
vLLM's error (a server that never answers still ends the run, at the start's timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sizes_bench import prompt_ids
from testbed.vllm_server import LocalServer, built_model, render_service, server_for_container, vllm_python

from cpullm.core.constants import DTYPE_BYTES

PROBE = Path(__file__).resolve().parent / "roofline_probe.py"
# vLLM's way for one rank: a worker process of its own, the launcher's fix turned off (cpullm/vllm_fixes.py).
THREE_PROCESSES = {"name": "CPULLM_VLLM_FIXES_OFF", "value": "rank_in_engine_core"}
Variant = Callable[[dict[str, Any]], None]  # edits the rendered container (its env) in place


def without_tcmalloc(container: dict[str, Any]) -> None:
    for entry in container["env"]:
        if entry["name"] == "LD_PRELOAD":
            entry["value"] = ":".join(p for p in entry["value"].split(":") if "tcmalloc" not in p)


def smt_siblings() -> bool:
    cpu0 = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    return cpu0.exists() and ("," in cpu0.read_text() or "-" in cpu0.read_text())


def configurations() -> list[tuple[str, dict[str, Any], Variant | None]]:
    """(name, spec fields, container edit) of each configuration compared."""
    rows: list[tuple[str, dict[str, Any], Variant | None]] = [
        ("rendered (launcher)", {}, None),
        ("1 CPU kept for the server", {"cpu": {"reservedCpusPerRank": 1}}, None),
        ("1 OpenMP thread (nobind)", {"cpu": {"threadsBind": "nobind", "reservedCpusPerRank": 1}}, None),
        ("glibc malloc (no tcmalloc)", {}, without_tcmalloc),
        ("eager (no torch.compile)", {"extraArgs": ["--enforce-eager"]}, None),
        ("prefill chunks of 512 tokens", {"extraArgs": ["--max-num-batched-tokens", "512"]}, None),
        ("rank in a worker process (vLLM's own)", {"env": [THREE_PROCESSES]}, None),
        ("float32 weights", {"model": {"dtype": "float32"}}, None),
    ]
    if smt_siblings():
        rows.append(("no SMT siblings bound", {"cpu": {"threadsBind": "auto"}}, None))
    return rows


def decode_rate(server: LocalServer, vocab: int, rounds: int) -> float:
    """One sequence's decode tokens/s: (long - short) tokens over the difference of their times, best of rounds."""

    prompt = prompt_ids(32, vocab, random.Random(1))
    server.complete(prompt, 8)  # warm-up
    best = 0.0
    for _ in range(rounds):
        times = []
        for tokens in (16, 144):
            started = time.monotonic()
            server.complete(prompt, tokens)
            times.append(time.monotonic() - started)
        best = max(best, 128 / (times[1] - times[0]))
    return best


def prefill_rate(server: LocalServer, vocab: int, rounds: int) -> float:
    """One prompt's prefill tokens/s: a 1,024-token prompt with one token out, best of rounds."""
    prompt = prompt_ids(1024, vocab, random.Random(2))
    best = 0.0
    for _ in range(rounds):
        started = time.monotonic()
        server.complete(prompt, 1)
        best = max(best, 1024 / (time.monotonic() - started))
    return best


def exception_line(text: str) -> str:
    """The first `SomeError: message` line of a server's exit report (its log's tail), else the whole report."""
    return next((line.strip() for line in text.splitlines() if re.match(r"\s*\w+(Error|Exception): ", line)), text)


def threads_of(log: Path) -> str:
    """The CPUs vLLM bound its rank's OpenMP threads to and those it reserved, from the lines that follow its
    "OpenMP thread binding info" header ("-": not logged)."""
    lines = log.read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(lines) if "OpenMP thread binding info" in line), None)
    if start is None:
        return "-"
    found = {}
    for line in lines[start + 1 : start + 8]:
        for key in ("core ids=", "reserved_cpus="):
            if key in line:
                found[key.rstrip("=")] = line.split(key, 1)[1].strip()
    return ", ".join(f"{key} {value}" for key, value in found.items()) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-1.5b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only", nargs="+", metavar="WORD", help="only the configurations whose name starts with one of these words"
    )
    args = parser.parse_args()
    chosen = [c for c in configurations() if not args.only or any(c[0].startswith(w) for w in args.only)]
    python = vllm_python()
    model = built_model(python, args.model)
    config = json.loads((model / "config.json").read_text())
    cpus = sorted(os.sched_getaffinity(0))
    roof = bandwidth(python, model, sorted({1, len(cpus)}))
    shard = roof["weights_bytes"]
    rows = []
    failures: list[tuple[str, str]] = []  # (configuration, the error vLLM exited with while starting)
    with tempfile.TemporaryDirectory(prefix="cpullm-roofline-") as tmp:
        for index, (name, spec, edit) in enumerate(chosen):
            workdir = Path(tmp) / f"c{index}"
            workdir.mkdir()
            _, container = render_service(workdir, model, 1, kvCacheGiB=1, maxModelLen=2048, maxNumSeqs=8, **spec)
            if edit:
                edit(container)
            server = server_for_container(container, workdir=workdir, python=python, model=model)
            try:
                server.start(timeout=3600)
            except RuntimeError as err:  # vLLM exited while starting: a row of its own, not the end of the run
                server.stop()
                failures.append((name, exception_line(str(err))))
                print(f"roofline_bench: {name}: did not start", file=sys.stderr, flush=True)
                continue
            try:
                rate = decode_rate(server, config["vocab_size"], args.rounds)
                prefill = prefill_rate(server, config["vocab_size"], args.rounds)
                # The roofline again, right after this row's decode (the server idle): a shared machine's
                # bandwidth moves between rows, and the row's ratio is against what its own minutes gave.
                own = bandwidth(python, model, [len(cpus)])["by_threads"][str(len(cpus))]
            finally:
                server.stop()
            measured = server.measured
            memory = measured.peak_working_set_bytes / measured.limit_bytes if measured.limit_bytes else 0.0
            streamed = shard * DTYPE_BYTES[spec.get("model", {}).get("dtype", "bfloat16")] // DTYPE_BYTES["bfloat16"]
            rows.append((name, measured.startup_seconds, rate, streamed, own, prefill, memory, threads_of(server.log)))
            print(f"roofline_bench: {name}: {rate:.2f} tok/s", file=sys.stderr, flush=True)

    print(
        f"\n{args.model}: {shard / 1e9:.2f} GB of bf16 weights streamed per token (in proportion for other dtypes); "
        f"{len(cpus)} CPUs (SMT: {smt_siblings()})"
    )
    print("bandwidth one rank's threads get, before the servers (torch " + roof["torch"] + "):")
    for threads, figures in sorted(roof["by_threads"].items()):
        print(
            f"  {threads} thread(s): streaming read {figures['stream_read_gbps']:.1f} GB/s, "
            f"bf16 GEMV of the model's shapes {figures['gemv_gbps']:.1f} GB/s"
        )
    print(f"\n{'configuration':<30}{'start s':>8}{'decode tok/s':>13}{'GB/s':>7}{'read':>7}{'/read':>7}", end="")
    print(f"{'/GEMV':>7}{'prefill tok/s':>14}{'WS/limit':>9}  binding")
    for name, started, rate, streamed, own, prefill, memory, threads in rows:
        gbps, read, gemv = rate * streamed / 1e9, own["stream_read_gbps"], own["gemv_gbps"]
        print(
            f"{name:<30}{started:>8.0f}{rate:>13.2f}{gbps:>7.1f}{read:>7.1f}{gbps / read:>7.2f}{gbps / gemv:>7.2f}"
            f"{prefill:>14.1f}{memory:>9.3f}  {threads}"
        )
    print(f"(read, /read, /GEMV: the {len(cpus)}-thread roofline measured right after each row's decode)")
    for name, error in failures:
        print(f"{name}: did not start: {error}")


def bandwidth(python: Path, model: Path, threads: list[int]) -> dict[str, Any]:
    """bench/roofline_probe.py's figures for these thread counts, in the vLLM environment."""
    probe = subprocess.run(
        [str(python), str(PROBE), str(model / "config.json"), *map(str, threads)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(probe.stdout)
    return result


if __name__ == "__main__":
    main()
