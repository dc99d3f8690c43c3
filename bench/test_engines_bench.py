"""The side-by-side engine benchmark's pure parts (bench/engines_bench.py runs by hand; this is its smoke run): the
rule it applies for vLLM's recipes, its table and its figure."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from bench.engines_bench import (
    Result,
    figure,
    handwritten_command,
    recipe_command,
    recipe_memory_utilization,
    table,
)

GIB_KB = 1024 * 1024  # /proc/meminfo counts kB


def meminfo(total_gib: float, free_gib: float, cached_gib: float = 0.0) -> str:
    kb = {
        "MemTotal": total_gib,
        "MemFree": free_gib,
        "Active(file)": cached_gib / 2,
        "Inactive(file)": cached_gib / 2,
        "SReclaimable": 0,
    }
    return "\n".join(f"{name}: {int(value * GIB_KB)} kB" for name, value in kb.items())


@pytest.mark.parametrize(
    ("total", "free", "cached", "share"),
    [
        (24, 22, 0, 0.80),  # plenty free: the recipes' own 0.80 when a recipe names none
        (24, 10, 6, 0.57),  # 16 of 24 available, less 0.10
        (24, 1, 1, -0.02),  # nearly full: 0.08 - 0.10, passed on as it is (vLLM refuses to start)
        (64, 64, 0, 0.80),  # at most 0.90, then at most 0.80
    ],
)
def test_the_recipes_memory_share_follows_the_tightest_nodes_available_memory(total, free, cached, share):
    assert recipe_memory_utilization(meminfo(total, free, cached)) == pytest.approx(share)


def test_the_recipes_and_the_handwritten_runs_are_the_flags_and_env_they_claim():
    python, model = Path("/venv/bin/python"), Path("/models/m")
    recipe, recipe_env = recipe_command(python, model, 8000, meminfo(24, 20))
    assert recipe[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m"]
    assert recipe[recipe.index("--tensor-parallel-size") + 1] == "1"
    assert recipe[recipe.index("--gpu-memory-utilization") + 1] == "0.73"
    assert recipe_env == {}  # no KV cache space: vLLM sizes it from the share
    handwritten, env = handwritten_command(python, model, 8000)
    assert "--gpu-memory-utilization" not in handwritten and env == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    assert not any(name.startswith("VLLM_CPU_OMP") for name in env)  # `auto` binding


def test_the_table_and_the_figure_show_every_row_and_why_one_has_no_figures():
    served = Result(
        "rendered pod, bf16",
        start_s=120,
        decode=8.0,
        streamed_bytes=3_000_000_000,
        read_gbps=40.0,
        throughput={1: 8.0, 8: 40.0, 32: 60.0},
        ttft_s=9.5,
        peak_ws=5 * 2**30,
        limit=6 * 2**30,
    )
    refused = Result("vLLM recipes' configuration", error="did not start: ValueError: not enough memory")
    killed = Result("vLLM docs' hand-written", oom=True, error="OOM-killed")
    lines = table([served, refused, killed]).splitlines()
    # start, decode, GB/s (8 tok/s x 3 GB), / the read, 8 and 32 streams, TTFT, peak WS and limit (GiB), OOM
    assert lines[2][len("rendered pod, bf16") :].split() == [
        "120",
        "8.00",
        "24.0",
        "0.60",
        "40.0",
        "60.0",
        "9.5",
        "5.00",
        "6.00",
        "no",
    ]
    assert lines[3].endswith("did not start: ValueError: not enough memory")
    assert lines[4].endswith("OOM-killed")
    svg = ElementTree.fromstring(figure([served, refused, killed], "title"))
    lines_drawn = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines_drawn) == 1  # only the row with figures
    legend = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "rendered pod, bf16" in legend and "vLLM docs' hand-written" not in legend
