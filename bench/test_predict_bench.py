"""bench/predict_bench.py --replay: a run's measurements predicted again with the model as it is now, without vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench import predict_bench

from cpullm.core.performance import Serving, kernel_of, parse_performance, predict
from cpullm.core.sizing import ModelSize, size_model

# A small Llama: what the replay sizes and predicts from.
CONFIG = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6}
CONFIG |= {"num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096}


def threads(count: int, read: float) -> dict[str, object]:
    rates = {"1": read, "8": 1.3 * read, "32": read, "256": 0.3 * read, "1024": 0.1 * read}
    return {"threads": count, "readBytesPerSecond": read, "smallKernelSeconds": 3e-5, "bf16WeightBytesPerSecond": rates}


PROBE = {
    "apiVersion": "cpullm.io/v1alpha1",
    "kind": "NodePerformance",
    "metadata": {"name": "localhost"},
    "spec": {
        "pythonSeconds": 0.007,
        "numaNodes": [{"node": 0, "cpus": 2, "oneThread": threads(1, 8e9), "allCores": threads(2, 15e9)}],
    },
}
MEASURED = {"decode": 11.0, "8 streams": 90.0, "32 streams": 220.0, "TTFT": 1.7}


def decode_kv(size: ModelSize) -> int:
    return size.kv_bytes_per_token_per_rank(1)


def test_a_replay_predicts_each_case_again_beside_its_measurements(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    run = [
        {"model": "qwen2.5-0.5b", "fmt": "bf16", "tp": 1, "measured": MEASURED, "predicted": {"decode": 1.0}}
        | {"probe": PROBE, "config": CONFIG, "threads": 2, "shares_cores": True},
        {"model": "qwen2.5-3b", "fmt": "bf16", "tp": 2, "error": "server did not start"},
        # a CPU of the rank's two kept for the front end: one thread, and no front-end charge on its cores
        {"model": "qwen2.5-0.5b", "fmt": "bf16", "tp": 1, "measured": MEASURED, "reserved": 1}
        | {"probe": PROBE, "config": CONFIG, "threads": 1, "shares_cores": False},
    ]
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(run))
    predict_bench.main(["--replay", str(saved)])
    lines = capsys.readouterr().out.splitlines()

    size = size_model(CONFIG, "bfloat16")
    serving = Serving(1, 2, *kernel_of(size), shares_cores=True)
    decode = predict(size, serving, parse_performance(PROBE), 1, decode_kv(size), context=528)
    now = decode.throughput_tokens_per_second
    assert lines[2].startswith("qwen2.5-0.5b        bf16         1")
    assert f"{now:.2f} / 11.00 ({now / 11.0:.2f})" in lines[2]  # the model's figure now, not the one saved
    assert lines[3].endswith("server did not start")
    kept = predict(size, Serving(1, 1, *kernel_of(size)), parse_performance(PROBE), 1, decode_kv(size), context=528)
    assert lines[4].startswith("qwen2.5-0.5b r1     bf16         1")
    assert f"{kept.throughput_tokens_per_second:.2f} / 11.00" in lines[4]


def test_every_probe_predicts_each_case_from_each_runs_probe(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Two runs, one probe each, the second machine twice as fast: each case's least and greatest ratio are its
    predictions from the two probes over its own measurement."""
    fast = {**PROBE, "spec": {**PROBE["spec"], "numaNodes": [{"node": 0, "cpus": 2, "oneThread": threads(1, 16e9),
                                                            "allCores": threads(2, 30e9)}]}}  # fmt: skip
    case = {"model": "qwen2.5-0.5b", "fmt": "bf16", "tp": 1, "measured": MEASURED, "config": CONFIG, "threads": 2}
    runs = []
    for index, probe in enumerate((PROBE, fast)):
        runs.append(tmp_path / f"run-{index}.json")
        runs[-1].write_text(json.dumps([case | {"probe": probe, "shares_cores": True}]))
    predict_bench.main(["--replay", *map(str, runs), "--every-probe"])
    lines = capsys.readouterr().out.splitlines()

    size = size_model(CONFIG, "bfloat16")
    serving, kv = Serving(1, 2, *kernel_of(size), shares_cores=True), size.kv_bytes_per_token_per_rank(1)
    slow, quick = (
        predict(size, serving, parse_performance(p), 1, kv, context=528).throughput_tokens_per_second / 11.0
        for p in (PROBE, fast)
    )
    assert slow < quick and len(lines) == 4
    assert all(f"{slow:.2f} / {quick:.2f} / {quick:.2f}" in line for line in lines[2:])
