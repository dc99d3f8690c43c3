"""Builds a LoRA adapter of a local Llama checkpoint in PEFT's format (adapter_config.json and
adapter_model.safetensors, the layout vLLM's --lora-modules loads): A and B of rank R for every linear layer of
every decoder layer, random and seeded, large enough that the adapted model's greedy completions differ from the
base model's. Runs in the vLLM environment (torch, safetensors): python make_adapter.py MODEL_DIR OUT_DIR RANK
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def shapes(config: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(input, output) features of each target module."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    return {
        "self_attn.q_proj": (hidden, q),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (q, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }


def main(model: Path, out: Path, rank: int) -> None:
    config = json.loads((model / "config.json").read_text())
    generator = torch.Generator().manual_seed(7)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (inputs, outputs) in shapes(config).items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            a = torch.randn(rank, inputs, generator=generator) / inputs**0.5
            b = torch.randn(outputs, rank, generator=generator) / rank**0.5
            tensors[f"{prefix}.lora_A.weight"] = a.to(torch.bfloat16)
            tensors[f"{prefix}.lora_B.weight"] = b.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "target_modules": list(TARGETS),
        "modules_to_save": None,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
