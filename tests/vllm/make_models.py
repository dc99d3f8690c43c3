"""Builds tiny random-weight checkpoints of the model kinds sizing distinguishes, for the vLLM comparison tests:
dense GQA (Llama), MoE (Qwen3-MoE), hybrid sliding-window attention (Gemma 3), MLA with vLLM CPU's 576-wide
latent (DeepSeek-V2), a GPTQ int4 Llama with random packed weights, and the hybrids: Mamba2 layers with an
attention layer (Granite 4.0-H), gated DeltaNet with gated attention (Qwen3-Next), chunked local attention
with a NoPE layer and experts (Llama 4), Mamba2, MLP and attention layers (Nemotron-H), and short convolutions with
an attention layer (LFM2); and DeepSeek-V3 with an MTP layer, for speculation. transformers (in the vLLM environment)
lays out the floating point ones under their real tensor names; nothing is downloaded. Runs in the vLLM environment:
python make_models.py KIND OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from make_tiny_model import CONFIG as LLAMA
from make_tiny_model import build_tokenizer, random_weights

VOCAB = 1024  # a multiple of 64: vLLM pads embeddings to one, and the tests compare bytes
COMMON: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "vocab_size": VOCAB,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "dense": {
        **COMMON,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 2048,
    },
    "moe": {
        **COMMON,
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "moe_intermediate_size": 128,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 2048,
    },
    # Every other layer slides over 256 tokens: a context of 4096 exceeds the window and the tokens in flight.
    "hybrid": {
        **COMMON,
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "sliding_window": 256,
        "sliding_window_pattern": 2,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    # kv_lora_rank + qk_rope_head_dim = 576, the only latent width vLLM CPU's MLA kernels take.
    "mla": {
        **COMMON,
        "model_type": "deepseek_v2",
        "architectures": ["DeepseekV2ForCausalLM"],
        "num_hidden_layers": 2,
        "num_key_value_heads": 4,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "v_head_dim": 64,
        "moe_intermediate_size": 128,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "max_position_embeddings": 2048,
    },
}
# Three state layers and one attention layer, as the hybrids' 3:1 to 9:1 patterns; a context of 4096 exceeds
# Llama 4's 256-token chunk and the tokens in flight.
HYBRID_LAYERS = ["linear_attention"] * 3 + ["full_attention"]
CONFIGS |= {
    "mamba2": {
        **COMMON,
        "model_type": "granitemoehybrid",
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "num_hidden_layers": 4,
        "layer_types": HYBRID_LAYERS,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "shared_intermediate_size": 256,
        "mamba_n_heads": 8,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "max_position_embeddings": 4096,
    },
    "gated_deltanet": {
        **COMMON,
        "model_type": "qwen3_next",
        "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 4,
        "layer_types": HYBRID_LAYERS,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
        "max_position_embeddings": 4096,
    },
    "chunked": {
        **COMMON,
        "model_type": "llama4_text",
        "architectures": ["Llama4ForCausalLM"],
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 128,
        "intermediate_size_mlp": 512,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "attention_chunk_size": 256,
        "no_rope_layers": [1, 1, 1, 0],
        "interleave_moe_layer_step": 1,
        "max_position_embeddings": 4096,
    },
    "nemotron_h": {
        **COMMON,
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
        "hybrid_override_pattern": "M-M-M*-",
        "num_key_value_heads": 2,
        "head_dim": 64,
        "mamba_num_heads": 8,
        "mamba_head_dim": 64,
        "n_groups": 1,
        "ssm_state_size": 64,
        "conv_kernel": 4,
        "max_position_embeddings": 4096,
    },
    "short_conv": {
        **COMMON,
        "model_type": "lfm2",
        "architectures": ["Lfm2ForCausalLM"],
        "num_hidden_layers": 4,
        "layer_types": ["conv"] * 3 + ["full_attention"],
        "num_key_value_heads": 2,
        "block_dim": 256,
        "conv_dim": 256,
        "block_ff_dim": 512,
        "block_multiple_of": 64,
        "conv_L_cache": 3,
        "tie_word_embeddings": True,  # as LFM2's are: vLLM ties its LM head to the embedding
        "max_position_embeddings": 4096,
    },
}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
# DeepSeek-V3 (MLA, sigmoid-scored experts) with one multi-token-prediction layer after its two decoder layers, laid
# out as DeepSeek-V3's checkpoint holds it: model.layers.2 is a decoder layer with enorm, hnorm, eh_proj, a
# shared_head (norm and LM head) and its own embed_tokens (vLLM's deepseek_mtp.py loads it as the drafter).
MTP = {
    **CONFIGS["mla"],
    "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
}


def build_transformers(kind: str, out: Path) -> None:
    config = AutoConfig.for_model(**CONFIGS[kind], dtype="bfloat16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.02)
    model.save_pretrained(out)


def build_mtp(out: Path) -> None:
    """MTP's checkpoint: transformers (which drops MTP layers) builds one decoder layer more, which then gets the MTP
    layer's own tensors, and the config counts it as num_nextn_predict_layers."""
    layers = MTP["num_hidden_layers"]
    CONFIGS["mtp"] = {**MTP, "num_hidden_layers": layers + 1}
    build_transformers("mtp", out)
    tensors = load_file(str(out / "model.safetensors"))
    hidden, prefix = MTP["hidden_size"], f"model.layers.{layers}"
    generator = torch.Generator().manual_seed(1)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{prefix}.{norm}.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    eh_proj = torch.randn(hidden, 2 * hidden, generator=generator) * 0.02
    tensors[f"{prefix}.eh_proj.weight"] = eh_proj.to(torch.bfloat16)
    tensors[f"{prefix}.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    tensors[f"{prefix}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers, "num_nextn_predict_layers": 1}))


def build_gptq(out: Path) -> None:
    """The tiny Llama's layout at 4 bits: each linear's weight becomes GPTQ's packed int32 qweight (in/8 x out),
    fp16 scales and packed zero points per 128 inputs, and a g_idx; embeddings, norms and the head stay fp16."""
    config = {**LLAMA, **COMMON, "num_key_value_heads": 2, "torch_dtype": "float16", "quantization_config": GPTQ}
    dense = random_weights(config, config["head_dim"])
    generator = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    for name, weight in dense.items():
        if not name.endswith("proj.weight"):
            tensors[name] = weight.to(torch.float16)
            continue
        out_features, in_features = weight.shape
        groups, stem = in_features // GPTQ["group_size"], name.removesuffix(".weight")
        tensors[f"{stem}.qweight"] = torch.randint(-(2**31), 2**31 - 1, (in_features // 8, out_features),
                                                   dtype=torch.int32, generator=generator)  # fmt: skip
        tensors[f"{stem}.qzeros"] = torch.full((groups, out_features // 8), 0x77777777, dtype=torch.int32)
        tensors[f"{stem}.scales"] = torch.full((groups, out_features), 0.002, dtype=torch.float16)
        tensors[f"{stem}.g_idx"] = torch.arange(in_features, dtype=torch.int32) // GPTQ["group_size"]
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))


def main(kind: str, out_dir: str) -> None:
    out = Path(out_dir)
    if kind == "gptq":
        build_gptq(out)
    elif kind == "mtp":
        build_mtp(out)
    else:
        build_transformers(kind, out)
    build_tokenizer(out, VOCAB, pad_to=VOCAB)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
