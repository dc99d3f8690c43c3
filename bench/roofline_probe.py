"""The memory bandwidth one rank's threads get on this machine, measured two ways with torch (run in the vLLM
environment by bench/roofline_bench.py; prints one JSON object):

- a streaming read: the sum of a bf16 tensor much larger than the caches;
- a bf16 GEMV of the model's shapes: one decode step's matrix-vector products (q/k/v, o, gate/up, down per layer,
  and the LM head) through torch.nn.functional.linear, as a decode step of one sequence streams each weight once.

python roofline_probe.py CONFIG_JSON THREADS [THREADS ...]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch


def best_seconds(run: Callable[[], object], rounds: int = 5) -> float:
    run()  # warm-up: pages touched, kernels chosen
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def layer_shapes(config: dict) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's weight matrices, q/k/v fused as vLLM fuses them, gate/up likewise."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    return [((heads + 2 * kv) * head_dim, hidden), (hidden, heads * head_dim), (2 * inter, hidden), (hidden, inter)]


def main(config_path: str, threads: list[int]) -> None:
    config = json.loads(Path(config_path).read_text())
    torch.manual_seed(0)
    layers = [
        [torch.randn(o, i, dtype=torch.bfloat16) for o, i in layer_shapes(config)]
        for _ in range(config["num_hidden_layers"])
    ]
    head = torch.randn(config["vocab_size"], config["hidden_size"], dtype=torch.bfloat16)
    weights = sum(w.numel() * 2 for layer in layers for w in layer) + head.numel() * 2
    stream = torch.ones(max(weights // 2, 2**30) // 2 * 2, dtype=torch.bfloat16)  # at least 1 GiB
    steps = [w for layer in layers for w in layer] + [head]
    inputs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=torch.bfloat16) for w in steps}

    def decode_step() -> None:
        for weight in steps:
            torch.nn.functional.linear(inputs[weight.shape[1]], weight)

    result: dict[str, object] = {"weights_bytes": weights, "torch": torch.__version__, "by_threads": {}}
    for count in threads:
        torch.set_num_threads(count)
        read = best_seconds(lambda: stream.sum())
        gemv = best_seconds(decode_step)
        result["by_threads"][count] = {  # type: ignore[index]
            "stream_read_gbps": stream.numel() * 2 / read / 1e9,
            "gemv_gbps": weights / gemv / 1e9,
            "gemv_step_seconds": gemv,
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], [int(t) for t in sys.argv[2:]])
