"""Builds random-weight models with the architectures and sizes of published ones, for the memory, start-up and
decode measurements at realistic sizes (nothing is downloaded): bf16 safetensors under the real tensor names,
with the tiny model's locally trained tokenizer padded to the vocabulary. Two vocabularies: Qwen2.5's 151,936
tokens and Llama 2's 32,000 (TinyLlama). Runs in the vLLM environment:
python make_sized_model.py NAME OUT_DIR    (NAME: one of SIZES)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from make_tiny_model import CONFIG, build_tokenizer, random_weights
from safetensors.torch import save_file

QWEN25 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "bos_token_id": 1,  # the local tokenizer's <s> and </s>
    "eos_token_id": 2,
}
# The published configs' dimensions (Qwen/Qwen2.5-{0.5B,1.5B,3B}-Instruct, TinyLlama/TinyLlama-1.1B-Chat-v1.0).
SIZES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        **QWEN25,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_window_layers": 21,
    },
    "qwen2.5-1.5b": {
        **QWEN25,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_window_layers": 21,
    },
    "qwen2.5-3b": {
        **QWEN25,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "max_window_layers": 70,
    },
    "tinyllama-1.1b": {  # the tests' tiny Llama's architecture at TinyLlama's size
        **CONFIG,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
    },
}


def main(name: str, out_dir: str) -> None:
    config = SIZES[name]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    size = build_tokenizer(out, pad_to=config["vocab_size"])
    assert size == config["vocab_size"], size
    if config["model_type"] == "qwen2":
        # transformers loads a qwen2 model's tokenizer as Qwen2Tokenizer, which adds its own pad token
        # (<|endoftext|>, one id past the embedding table) unless one is named.
        settings = json.loads((out / "tokenizer_config.json").read_text())
        (out / "tokenizer_config.json").write_text(json.dumps(settings | {"pad_token": "</s>"}))
    settings = json.loads((out / "tokenizer_config.json").read_text())
    limit = {"model_max_length": config["max_position_embeddings"]}
    (out / "tokenizer_config.json").write_text(json.dumps(settings | limit))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    tensors = random_weights(config, head_dim, qkv_bias=config["model_type"] == "qwen2")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
