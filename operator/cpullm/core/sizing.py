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

# Upper bounds on config fields, each far above any real dense model (Llama 3.1 405B: hidden 16384,
# intermediate 53248, 126 layers, 128 heads; vocabularies up to 262144; contexts up to 10M tokens). A value
# beyond is a typo or garbage: refused with the field's name rather than planned into absurd sizes.
MAX_CONFIG_VALUES = {
    "hidden_size": 2**20,
    "intermediate_size": 2**22,
    "num_hidden_layers": 2**14,
    "num_attention_heads": 2**14,
    "num_key_value_heads": 2**14,
    "head_dim": 2**14,
    "vocab_size": 2**24,
    "max_position_embeddings": 2**40,
}
# A safetensors index's total_size beyond this (4 EiB) is no checkpoint.
MAX_CHECKPOINT_BYTES = 2**62


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
    family = config.get("model_type")
    if not isinstance(family, str) or family not in DENSE_FAMILIES:
        raise UnsupportedModel(
            f"model_type {'(missing)' if family in (None, '') else _show(family)} is not a supported dense family "
            f"({', '.join(sorted(DENSE_FAMILIES))}); set spec.model.weightsBytes to size it"
        )
    h = _int(config, "hidden_size")
    i = _int(config, "intermediate_size")
    layers = _int(config, "num_hidden_layers")
    heads, kv_heads = _heads(config)
    d = _head_dim(config)
    vocab = _int(config, "vocab_size")
    tied = _bool(config, "tie_word_embeddings", False)

    attention = h * heads * d + 2 * h * kv_heads * d + heads * d * h
    if _bool(config, "attention_bias", family == "qwen2"):
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
        torch_dtype = config.get("torch_dtype")
        stored = DTYPE_BYTES.get(torch_dtype, 2) if isinstance(torch_dtype, str) else 2
        if (
            isinstance(checkpoint_total_bytes, bool)
            or not isinstance(checkpoint_total_bytes, int)
            or not stored <= checkpoint_total_bytes <= MAX_CHECKPOINT_BYTES
        ):
            raise UnsupportedModel(
                f"model.safetensors.index.json total_size={_show(checkpoint_total_bytes)} is not a checkpoint size "
                f"({stored} to {MAX_CHECKPOINT_BYTES} bytes); set spec.model.weightsBytes to size the model"
            )
        parameters = checkpoint_total_bytes // stored
        weights_bytes = parameters * dtype_bytes
        source = "model.safetensors.index.json"
    else:
        parameters = count_parameters(config)
        weights_bytes = parameters * dtype_bytes
        source = "config.json"
    heads, kv_heads = _heads(config)
    return ModelSize(
        parameters=parameters,
        weights_bytes=weights_bytes,
        weights_source=source,
        num_layers=_int(config, "num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_head_dim(config),
        dtype_bytes=dtype_bytes,
        max_position_embeddings=(
            _int(config, "max_position_embeddings") if config.get("max_position_embeddings") is not None else None
        ),
    )


def _heads(config: Mapping[str, Any]) -> tuple[int, int]:
    """(attention heads, KV heads): each KV head serves a whole group of attention heads (GQA), so the KV heads
    divide the attention heads; without num_key_value_heads there are as many as attention heads (MHA)."""
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise UnsupportedModel(
            f"model config num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}"
        )
    return heads, kv_heads


def _head_dim(config: Mapping[str, Any]) -> int:
    if config.get("head_dim") is not None:
        return _int(config, "head_dim")
    hidden, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
    if hidden < heads:
        raise UnsupportedModel(
            f"model config hidden_size={hidden} is smaller than num_attention_heads={heads}: head_dim "
            "(hidden_size // num_attention_heads) would be 0; set head_dim in spec.model.config"
        )
    return hidden // heads


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise UnsupportedModel(f"model config lacks {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedModel(f"model config {key}={_show(value)} is not a positive integer")
    if value > MAX_CONFIG_VALUES.get(key, value):
        raise UnsupportedModel(
            f"model config {key}={_show(value)} is beyond any real model (at most {MAX_CONFIG_VALUES[key]}); "
            "check the config"
        )
    return value


def _bool(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise UnsupportedModel(f"model config {key}={_show(value)} is not true or false")
    return value


def _show(value: object) -> str:
    """A config value for a message, cut short: a garbage value can be arbitrarily long (and repr() refuses
    integers of more than 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"(a {value.bit_length()}-bit integer)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
