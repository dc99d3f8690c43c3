"""Benchmark, not a test: where one sequence's decode time goes in the rendered pod. Starts the rendered
bf16 pod as bench/engines_bench.py does, keeps one long completion decoding, and samples the engine core process
(where the launcher runs the rank: the model's kernels run there) with py-spy, native frames included; then splits
the per-token time of its thread that runs the model into the model's matrix products, attention, sampling, the
scheduler and the rest of the engine core's Python, and the time it waits (for the API server or a request).

    .venv/bin/python bench/decode_profile.py [--seconds 30] [--model qwen2.5-1.5b]

py-spy comes from PyPI into ~/.cache/cpullm-operator/tools/py-spy on first use (pip install --target).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sizes_bench import prompt_ids
from testbed.vllm_server import built_model, render_service, server_for_container, vllm_python

PY_SPY = Path.home() / ".cache" / "cpullm-operator" / "tools" / "py-spy"
SPIN = ("sched_yield", "kmp_flag", "kmp_wait", "gomp_")  # an OpenMP thread waiting at a barrier for the others
INDUCTOR_KERNEL = "kernel (c"  # torch.compile's generated C++ kernels: files named c<hash>


def category(stack: str) -> str:
    """Where one sample of the model's thread was, from its frames (innermost last): oneDNN's matrix products (its
    JIT-generated code has no symbol: '(?)'), torch.compile's fused elementwise kernels (norms, rotary, activations,
    residual adds), attention, sampling, the scheduler, and, inside the first two, waiting at the OpenMP barrier
    for the other threads."""
    frames = stack.split(";")
    text, leaf = stack.lower(), frames[-1]
    spinning = any(word in leaf.lower() for word in SPIN)
    if "/sample/" in text or "sampler" in text:
        return "sampling"
    if "attention" in text or "attn" in text:
        return "attention"
    if "dnnl" in text or "onednn" in text or "brgemm" in text or ("(?)" in leaf and "_ops.py" in stack):
        return "matrix products: waiting at the barrier" if spinning else "matrix products (oneDNN)"
    if INDUCTOR_KERNEL in stack:
        return "fused elementwise kernels: waiting at the barrier" if spinning else "fused elementwise kernels"
    if "/core/sched/" in stack or "update_from_output" in stack:
        return "scheduler and output handling"
    if "execute_model" in stack:
        return "model runner's Python (inputs, outputs)"
    return "the engine core's loop (waiting for work)"


def py_spy() -> Path:
    binary = PY_SPY / "bin" / "py-spy"
    if not binary.exists():
        pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(PY_SPY), "py-spy"]
        subprocess.run(pip, check=True)
    return binary


def model_thread_samples(raw: str) -> Counter[str]:
    """Samples per category of the one thread that runs the model (py-spy's raw format with -t: each line is a
    thread's frames, `;`-joined, the thread first, then a count)."""
    by_thread: dict[str, Counter[str]] = {}
    model_samples: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        thread = stack.split(";", 1)[0]
        by_thread.setdefault(thread, Counter())[category(stack)] += int(count)
        if "execute_model" in stack:
            model_samples[thread] += int(count)
    if not model_samples:
        raise RuntimeError("no thread of the engine core ran execute_model while sampled")
    return by_thread[model_samples.most_common(1)[0][0]]


def engine_core(pid: int) -> int:
    """The engine core process of the server started as `pid` (vLLM names it VLLM::EngineCore)."""
    for child in psutil.Process(pid).children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child.pid
    raise RuntimeError("no VLLM::EngineCore process under the server")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-1.5b")
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--stacks", type=Path, help="keep py-spy's raw stacks here")
    args = parser.parse_args()
    python = vllm_python()
    model = built_model(python, args.model)
    vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
    spy = py_spy()
    with tempfile.TemporaryDirectory(prefix="cpullm-profile-") as tmp:
        workdir = Path(tmp)
        _, container = render_service(workdir, model, 1, kvCacheGiB=None, maxModelLen=2048, maxNumSeqs=32)
        server = server_for_container(container, workdir=workdir, python=python, model=model)
        server.start(timeout=1800)
        try:
            prompt = prompt_ids(32, vocab, random.Random(1))
            server.complete(prompt, 8)  # warm-up
            tokens = 1900  # longer than the sampling window decodes
            done: dict[str, float] = {}

            def decode() -> None:
                started = time.monotonic()
                server.complete(prompt, tokens)
                done["seconds"] = time.monotonic() - started

            worker = threading.Thread(target=decode)
            worker.start()
            time.sleep(3)  # past the prefill
            assert server.process is not None
            raw = workdir / "stacks.txt"
            record = [str(spy), "record", "-p", str(engine_core(server.process.pid)), "--native", "--idle", "-t"]
            record += ["--rate", "20", "--duration", str(args.seconds), "-f", "raw", "-o", str(raw)]
            spied = subprocess.run(record, capture_output=True, text=True)
            if spied.returncode != 0:
                raise RuntimeError(f"py-spy failed: {spied.stderr.strip() or spied.stdout.strip()}")
            worker.join()
        finally:
            server.stop()
        samples = model_thread_samples(raw.read_text())
        if args.stacks:
            shutil.copy(raw, args.stacks)
    per_token_ms = done["seconds"] / tokens * 1000
    total = sum(samples.values())
    print(f"\n{args.model}: {tokens} tokens of one sequence in {done['seconds']:.1f} s, {per_token_ms:.1f} ms/token")
    print(f"the engine core's thread that runs the model, sampled {args.seconds} s at 20/s ({total} samples)")
    print(f"{'where':<52}{'share':>8}{'ms/token':>10}")
    for name, count in samples.most_common():
        print(f"{name:<52}{count / total:>8.2f}{count / total * per_token_ms:>10.1f}")
    print("(the thread's own time, OpenMP's other threads not sampled: they run the same kernels beside it)")


if __name__ == "__main__":
    main()
