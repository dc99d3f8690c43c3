"""LoRA adapters (spec.adapters) as vLLM's CPU backend serves them: the flags, and the memory a rank holds for them.

vLLM wraps every linear layer of the model it can (its LoRAModelManager) and gives each, per rank, a slot buffer of
`--max-loras` adapters at `--max-lora-rank`: A (rank x input) and B (output x rank), the input split by TP for a
row-parallel layer and the output for a column-parallel one. Each worker also keeps every adapter it loaded, whole,
in its CPU cache (`--max-cpu-loras`). The plan serves all the listed adapters at once, so both counts are the
number of adapters. docs/adapters.md has the figures and what LoRA costs on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from cpullm.api.spec import Adapter
from cpullm.core.sizing import ModelSize
from cpullm.core.sizing.anatomy import Split
from cpullm.vllm_support import LORA_RANKS


def lora_rank(adapters: Sequence[Adapter]) -> int:
    """vLLM's --max-lora-rank: the smallest rank it accepts that holds every adapter's."""
    highest = max(a.rank for a in adapters)
    return next(r for r in LORA_RANKS if r >= highest)


def lora_args(adapters: Sequence[Adapter] | None) -> list[str]:
    """The server's LoRA flags; none without adapters."""
    if not adapters:
        return []
    count = str(len(adapters))
    return [
        "--enable-lora",
        "--max-loras",
        count,
        "--max-cpu-loras",
        count,
        "--max-lora-rank",
        str(lora_rank(adapters)),
        "--lora-modules",
        *(f"{a.name}={a.source}" for a in adapters),
    ]


def _rank_features(model: ModelSize, tp: int) -> tuple[int, int]:
    """Per rank, the sum over vLLM's wrapped linear layers of the A and B sides' widths for one unit of LoRA rank:
    (as its slot buffers split them by TP, whole)."""
    split = whole = 0
    for linear in model.anatomy.linears:
        inputs, outputs = linear.in_features, linear.out_features
        whole += (inputs + outputs) * linear.count
        if linear.split in (Split.COLUMN, Split.HEADS):  # KV heads TP replicates count as split: a few KiB
            split += (inputs + -(-outputs // tp)) * linear.count
        elif linear.split == Split.ROW:
            split += (-(-inputs // tp) + outputs) * linear.count
        else:
            split += (inputs + outputs) * linear.count
    return split, whole


def adapter_bytes(model: ModelSize, adapters: Sequence[Adapter] | None, tp: int) -> int:
    """What one rank holds for the adapters: the slot buffers at --max-lora-rank for each of them, and each one's
    own weights in the worker's CPU cache, in the serving dtype."""
    if not adapters:
        return 0
    split, whole = _rank_features(model, tp)
    slots = len(adapters) * lora_rank(adapters) * split
    cached = sum(a.rank for a in adapters) * whole
    return (slots + cached) * model.dtype_bytes
