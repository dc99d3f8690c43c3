"""Model sizing from a Hugging Face config.json: parameters, weight bytes, KV bytes per token.

Dense decoder families (Llama, Mistral, Qwen2, Qwen3). Per layer:
  attention  q: h*(H*d)  k, v: h*(K*d) each  o: (H*d)*h   (+ q/k/v biases for Qwen2; q/k norms for Qwen3)
  MLP        gate, up, down: 3*h*i
  norms      2*h
plus embeddings v*h, an LM head v*h unless tied, and a final norm h; where h = hidden_size, i =
intermediate_size, H = attention heads, K = KV heads, d = head_dim (default h/H), v = vocab_size.
KV bytes per token = 2 (K and V) x layers x K x d x dtype bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cpullm.api.spec import DType
from cpullm.core.constants import DTYPE_BYTES
from cpullm.errors import UnsupportedModel

# The families the parameter formula above is right for; it lives beside the formula it scopes.
DENSE_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass(frozen=True)
class ModelFiles:
    """What a model repository says about its size: config.json, and the safetensors index's total size."""

    config: dict[str, Any]
    checkpoint_total_bytes: int | None


@dataclass(frozen=True)
class ModelSize:
    parameters: int | None
    weights_bytes: int
    weights_source: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_position_embeddings: int | None

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes_per_token_per_rank(1)

    def kv_bytes_per_token_per_rank(self, tensor_parallel_size: int) -> int:
        """2 (K and V) x layers x KV heads x head dim x dtype bytes. Each rank holds K/TP KV heads; with
        TP > K, vLLM replicates and each rank holds one."""
        heads = max(1, self.num_kv_heads // tensor_parallel_size)
        return 2 * self.num_layers * heads * self.head_dim * self.dtype_bytes


def count_parameters(config: Mapping[str, Any]) -> int:
    """Parameter count of a dense decoder config; raises UnsupportedModel for other families."""
    family = str(config.get("model_type", ""))
    if family not in DENSE_FAMILIES:
        raise UnsupportedModel(
            f"model_type {family or '(missing)'!r} is not a supported dense family "
            f"({', '.join(sorted(DENSE_FAMILIES))}); set spec.model.weightsBytes to size it"
        )
    h = _int(config, "hidden_size")
    i = _int(config, "intermediate_size")
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    d = _head_dim(config)
    vocab = _int(config, "vocab_size")
    tied = bool(config.get("tie_word_embeddings", False))

    attention = h * heads * d + 2 * h * kv_heads * d + heads * d * h
    if config.get("attention_bias", family == "qwen2"):
        attention += heads * d + 2 * kv_heads * d
    if family == "qwen3":
        attention += 2 * d  # per-head RMSNorm on q and k
    per_layer = attention + 3 * h * i + 2 * h
    return layers * per_layer + vocab * h * (1 if tied else 2) + h


def size_model(
    config: Mapping[str, Any],
    dtype: DType,
    *,
    weights_bytes: int | None = None,
    checkpoint_total_bytes: int | None = None,
) -> ModelSize:
    """Size a model. Weight bytes come from, in order: the explicit override, the safetensors index's
    total size (rescaled from the checkpoint dtype to the serving dtype), the parameter count."""
    dtype_bytes = DTYPE_BYTES[dtype]
    parameters: int | None = None
    if weights_bytes is not None:
        source = "spec.model.weightsBytes"
    elif checkpoint_total_bytes is not None:
        stored = DTYPE_BYTES.get(str(config.get("torch_dtype", "bfloat16")), 2)
        parameters = checkpoint_total_bytes // stored
        weights_bytes = parameters * dtype_bytes
        source = "model.safetensors.index.json"
    else:
        parameters = count_parameters(config)
        weights_bytes = parameters * dtype_bytes
        source = "config.json"
    heads = _int(config, "num_attention_heads")
    max_positions = config.get("max_position_embeddings")
    return ModelSize(
        parameters=parameters,
        weights_bytes=weights_bytes,
        weights_source=source,
        num_layers=_int(config, "num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=_int(config, "num_key_value_heads", heads),
        head_dim=_head_dim(config),
        dtype_bytes=dtype_bytes,
        max_position_embeddings=int(max_positions) if isinstance(max_positions, int) else None,
    )


def _head_dim(config: Mapping[str, Any]) -> int:
    explicit = config.get("head_dim")
    if explicit is not None:
        return _int(config, "head_dim")
    return _int(config, "hidden_size") // _int(config, "num_attention_heads")


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise UnsupportedModel(f"model config lacks {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedModel(f"model config {key}={value!r} is not a positive integer")
    return value
