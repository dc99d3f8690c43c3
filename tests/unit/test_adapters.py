"""LoRA adapters (core/adapters.py): the flags vLLM is given, the memory a rank holds for them, and the plan's."""

from __future__ import annotations

import pytest
import yaml

from cpullm.api.spec import Adapter, parse_spec
from cpullm.cli import main
from cpullm.core.adapters import adapter_bytes, lora_args, lora_rank
from cpullm.core.children.deployment import vllm_args
from cpullm.core.constants import GiB
from cpullm.core.planner import plan_service

from .builders import LLAMA_8B, llama_8b, node, node_object
from .support import cli


def adapters(*ranks: int) -> list[Adapter]:
    return [Adapter(name=f"a{i}", source=f"org/a{i}", rank=r) for i, r in enumerate(ranks)]


@pytest.mark.parametrize(
    ("ranks", "rendered"),
    [((1,), 1), ((4,), 8), ((8,), 8), ((9, 16), 16), ((300,), 320), ((512, 2), 512)],
)
def test_the_rank_vllm_is_given_is_the_smallest_it_takes_that_holds_every_adapter(ranks, rendered):
    assert lora_rank(adapters(*ranks)) == rendered


def test_the_flags_serve_every_adapter_at_once_under_its_name():
    assert lora_args(None) == lora_args([]) == []
    assert lora_args(adapters(4, 16)) == [
        "--enable-lora",
        "--max-loras",
        "2",
        "--max-cpu-loras",
        "2",
        "--max-lora-rank",
        "16",
        "--lora-modules",
        "a0=org/a0",
        "a1=org/a1",
    ]


# Llama-3.1-8B's linear layers, per layer, as (input + output) features for one unit of LoRA rank: q, k, v (4096 to
# 4096, 1024, 1024), o (4096 to 4096), gate and up (4096 to 14336) and down (14336 to 4096); 32 layers.
LLAMA_8B_WHOLE = 32 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 2 * (4096 + 14336) + (14336 + 4096))
# At TP 2 the column-parallel layers' outputs halve (q, k, v, gate, up) and the row-parallel ones' inputs (o, down).
LLAMA_8B_TP2 = 32 * ((4096 + 2048) + 2 * (4096 + 512) + (2048 + 4096) + 2 * (4096 + 7168) + (7168 + 4096))


@pytest.mark.parametrize(
    ("ranks", "tp", "expected"),
    [
        ((), 1, 0),
        # one adapter of rank 16: its slot at rank 16, and its own weights cached
        ((16,), 1, (16 * LLAMA_8B_WHOLE + 16 * LLAMA_8B_WHOLE) * 2),
        # two adapters, ranks 4 and 16: two slots at rank 16, and 4 + 16 of rank cached whole on every rank
        ((4, 16), 2, (2 * 16 * LLAMA_8B_TP2 + 20 * LLAMA_8B_WHOLE) * 2),
    ],
)
def test_a_rank_holds_a_slot_per_adapter_at_the_highest_rank_and_each_adapter_whole(ranks, tp, expected):
    assert adapter_bytes(llama_8b(), adapters(*ranks), tp) == expected


def test_the_plan_counts_the_adapters_memory_and_the_server_is_given_them():
    base = {"model": {"name": "meta-llama/Llama-3.1-8B", "config": LLAMA_8B}, "kvCacheGiB": 4}
    tuned = {**base, "adapters": [{"name": "support-bot", "source": "/models/adapters/support", "rank": 64}]}
    nodes = [node("n1", numa=2, memory="512Gi")]
    without, with_adapter = (plan_service(parse_spec(s), llama_8b(), nodes) for s in (base, tuned))
    per_rank = adapter_bytes(llama_8b(), parse_spec(tuned).adapters, with_adapter.tensor_parallel_size)
    assert without.adapter_bytes == 0 and with_adapter.adapter_bytes == per_rank > 0
    # every rank holds them, with the budget's margin
    grown = with_adapter.memory_limit_bytes - without.memory_limit_bytes
    assert with_adapter.tensor_parallel_size * per_rank <= grown <= 1.2 * with_adapter.tensor_parallel_size * per_rank
    args = vllm_args(parse_spec(tuned), with_adapter)
    assert args[args.index("--lora-modules") + 1] == "support-bot=/models/adapters/support"
    assert args[args.index("--max-lora-rank") + 1] == "64"


def test_cpullm_plan_prints_the_adapters_memory(tmp_path, capsys):
    service = {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "metadata": {"name": "tuned"},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B", "config": LLAMA_8B},
            "kvCacheGiB": 4,
            "adapters": [{"name": "support-bot", "source": "org/support-lora", "rank": 16}],
        },
    }
    nodes = {"apiVersion": "v1", "kind": "List", "items": [node_object("n1", numa=2, memory="512Gi")]}
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(service))
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(nodes))
    args = ["plan", str(tmp_path / "svc.yaml"), "--nodes", str(tmp_path / "nodes.yaml")]
    planned = cli(capsys, *args, "-o", "json")
    per_rank = planned["adapterBytes"]
    assert per_rank == adapter_bytes(llama_8b(), adapters(16), planned["tensorParallelSize"])
    assert main(args) == 0
    assert f"LoRA adapters {per_rank / GiB:.2f} GiB" in capsys.readouterr().out


def test_with_adapters_the_plan_predicts_slower_decoding_for_lora_s_uncompiled_layers():
    base = {"model": {"name": "meta-llama/Llama-3.1-8B", "config": LLAMA_8B}, "kvCacheGiB": 4}
    tuned = {**base, "adapters": [{"name": "support-bot", "source": "org/support-lora", "rank": 16}]}
    nodes = [node("n1", numa=2, memory="512Gi")]
    without, with_adapter = (plan_service(parse_spec(s), llama_8b(), nodes).predicted for s in (base, tuned))
    assert without is not None and with_adapter is not None
    assert with_adapter.decode_tokens_per_second < without.decode_tokens_per_second
    assert with_adapter.throughput_tokens_per_second < without.throughput_tokens_per_second
