"""Benchmark, not a test: how long `cpullm plan` takes from the shell, offline (`--model-config`, a nodes file), the
median of --runs fresh processes, and where its imports go (python -X importtime, one more run): the figure a user
waits for, and what to make lazy next. Run it on an idle machine; the machine and its load change it more than any
one import does.

    .venv/bin/python bench/cli_bench.py [--runs 15] [--top 12]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICE = """apiVersion: cpullm.io/v1alpha1
kind: CpuLLMService
metadata: {name: llama}
spec:
  model: {name: meta-llama/Llama-3.1-8B-Instruct}
  kvCacheGiB: 4
"""


def command(service: Path) -> list[str]:
    config = ROOT / "tests" / "unit" / "fixtures" / "models" / "llama-3.1-8b.json"
    nodes = ROOT / "examples" / "nodes.yaml"
    return [sys.executable, "-m", "cpullm", "plan", str(service), "--nodes", str(nodes), "--model-config", str(config)]


def imports(args: list[str], top: int) -> list[tuple[float, str]]:
    """The modules imported at the top level or by one of those, with the most cumulative import time: (seconds,
    module, indented by its level); python -X importtime indents a module two spaces a level below its importer."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args[1:]], capture_output=True, text=True, check=True)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        level = (len(name) - len(name.lstrip())) // 2
        if level <= 1:
            rows.append((int(cumulative) / 1e6, "  " * level + name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--top", type=int, default=12)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        service = Path(workdir) / "service.yaml"
        service.write_text(SERVICE)
        args = command(service)
        subprocess.run(args, check=True, capture_output=True)  # warm the page cache and the byte-code files
        seconds = []
        for _ in range(options.runs):
            started = time.perf_counter()
            subprocess.run(args, check=True, capture_output=True)
            seconds.append(time.perf_counter() - started)
        top = imports(args, options.top)
    load = os.getloadavg()[0]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {load:.2f}")
    print(
        f"cpullm plan (offline, --model-config): median {statistics.median(seconds):.3f} s, "
        f"min {min(seconds):.3f} s, max {max(seconds):.3f} s over {options.runs} runs"
    )
    print("imports at the top level and one below, cumulative:")
    for spent, name in top:
        print(f"  {spent:6.3f} s  {name}")


if __name__ == "__main__":
    main()
