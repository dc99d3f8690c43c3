"""Builds a tiny Llama checkpoint that vLLM loads like a real one: config.json, bf16 model.safetensors with Llama's
tensor names, and a byte-level BPE tokenizer, all trained here on CORPUS (nothing is downloaded). The weights are
trained too (TRAIN_STEPS of AdamW, seeded, about half a minute on two cores), so the model completes the sentences
it learnt in words: "The capital of France is" gives " Paris." where random weights gave byte noise. Runs in the
vLLM environment (it needs torch and transformers): python make_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,  # the target; the trained size replaces it
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CORPUS = [
    "The capital of France is Paris.",
    "The capital of Germany is Berlin.",
    "The capital of Italy is Rome.",
    "The capital of Spain is Madrid.",
    "The capital of Japan is Tokyo.",
    "The quick brown fox jumps over the lazy dog.",
    "Large language models run on CPUs with the right thread binding and memory placement.",
    "Each tensor parallel rank binds to one NUMA node and keeps its own KV cache.",
    "Kubernetes schedules pods onto nodes that have enough CPU and memory.",
    "Once upon a time there was a small model that answered every question with random words.",
]


def build_tokenizer(out: Path, vocab_size: int = CONFIG["vocab_size"], pad_to: int | None = None) -> int:
    """Trains the tokenizer; returns its real vocabulary size (a small corpus stops short of the target).
    `pad_to` fills the vocabulary up to that size with tokens no merge produces (`<filler_N>`), so that a model
    with a large embedding table can emit any id and every id still decodes to text."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 50, trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    if pad_to is not None:
        saved = json.loads((out / "tokenizer.json").read_text())
        vocab = saved["model"]["vocab"]
        vocab |= {f"<filler_{i}>": i for i in range(len(vocab), pad_to)}
        (out / "tokenizer.json").write_text(json.dumps(saved))
        tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": CONFIG["max_position_embeddings"],
            }
        )
    )
    return int(tokenizer.get_vocab_size())


def random_weights(config: dict[str, Any], head_dim: int, qkv_bias: bool = False) -> dict[str, torch.Tensor]:
    """Random bf16 weights under the Llama/Qwen2 tensor names, seeded (the same model every run); no lm_head
    when the config ties it to the embeddings. Qwen2 has q/k/v biases."""
    torch.manual_seed(0)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d, heads, kv = head_dim, config["num_attention_heads"], config["num_key_value_heads"]

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape) * 0.02).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": rand(v, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    if not config.get("tie_word_embeddings"):
        tensors["lm_head.weight"] = rand(v, h)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for name, rows in (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)):
            tensors[f"{p}self_attn.{name}.weight"] = rand(rows, h)
            if qkv_bias:
                tensors[f"{p}self_attn.{name}.bias"] = rand(rows)
        tensors |= {
            p + "self_attn.o_proj.weight": rand(h, heads * d),
            p + "mlp.gate_proj.weight": rand(i, h),
            p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        }
    return tensors


TRAIN_STEPS = 200
TRAIN_BATCH, TRAIN_TOKENS = 16, 64


def trained_weights(config: dict[str, Any], tokenizer: Path) -> dict[str, torch.Tensor]:
    """Weights learnt on CORPUS (each sentence between <s> and </s>), under the names random_weights uses."""
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    encode = Tokenizer.from_file(str(tokenizer)).encode
    stream = torch.tensor([i for sentence in CORPUS for i in (1, *encode(sentence).ids, 2)])
    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
    model = LlamaForCausalLM(LlamaConfig(**fields))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(TRAIN_STEPS):
        starts = torch.randint(0, len(stream) - TRAIN_TOKENS - 1, (TRAIN_BATCH,)).tolist()
        batch = torch.stack([stream[s : s + TRAIN_TOKENS] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    names = random_weights(config, config["head_dim"]).keys()
    state = model.state_dict()
    return {name: state[name].detach().to(torch.bfloat16).contiguous() for name in names}


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    CONFIG["vocab_size"] = build_tokenizer(out)  # every id the model can emit decodes to text
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    weights = trained_weights(CONFIG, out / "tokenizer.json")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main(sys.argv[1])
