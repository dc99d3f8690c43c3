"""Builds a random-weight model with the architecture and sizes of Qwen2.5-0.5B-Instruct (Qwen2ForCausalLM:
hidden 896, intermediate 4864, 24 layers, 14 heads, 2 KV heads, vocabulary 151936, tied embeddings, q/k/v
biases; 494M parameters, 0.99 GB in bf16), with the tiny model's locally trained tokenizer padded to the
vocabulary (nothing is downloaded). For the opt-in memory measurement at ~0.5B parameters
(CPULLM_VLLM_LARGE=1, tests/vllm/test_rendered_pod.py). Runs in the vLLM environment:
python make_qwen_model.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from make_tiny_model import build_tokenizer, random_weights
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
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


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    size = build_tokenizer(out, pad_to=CONFIG["vocab_size"])
    assert size == CONFIG["vocab_size"], size
    # transformers loads a qwen2 model's tokenizer as Qwen2Tokenizer, which adds its own pad token
    # (<|endoftext|>, one id past the embedding table) unless one is named.
    settings = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(settings | {"pad_token": "</s>"}))
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    head_dim = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    tensors = random_weights(CONFIG, head_dim, qkv_bias=True)  # tied embeddings: no lm_head
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main(sys.argv[1])
