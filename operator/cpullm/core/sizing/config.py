"""A Hugging Face config.json read as the sizing rules need it: typed fields, the family's defaults for fields a
config may leave out (as transformers' config classes default them), the text model of a multimodal config
(`text_config`), and errors that name every missing field at once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cpullm.errors import UnsupportedModel

# Upper bounds on config fields, each far above any real model (Llama 3.1 405B: hidden 16384, intermediate 53248,
# 126 layers, 128 heads; vocabularies up to 262144; contexts up to 10M tokens; DeepSeek-V3: 256 experts). A value
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
DEFAULT_MAX_VALUE = 2**40  # any other size field (experts, ranks, windows)
WEIGHTS_OVERRIDE_HINT = "set spec.model.weightsBytes to size the weights"


@dataclass(frozen=True)
class ConfigView:
    """One config (the text model's, for a multimodal one) with its family's defaults underneath."""

    values: Mapping[str, Any]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    family: str = "(missing)"

    def has(self, key: str) -> bool:
        return self.values.get(key) is not None or self.defaults.get(key) is not None

    def raw(self, key: str) -> Any:
        value = self.values.get(key)
        return self.defaults.get(key) if value is None else value

    def require(self, *keys: str, why: str = WEIGHTS_OVERRIDE_HINT) -> None:
        """Raises one UnsupportedModel naming every key of `keys` the config lacks."""
        missing = [key for key in keys if not self.has(key)]
        if missing:
            raise UnsupportedModel(f"model config (model_type {self.family}) lacks {', '.join(missing)}; {why}")

    def positive(self, key: str, default: int | None = None) -> int:
        value = self.raw(key)
        if value is None:
            value = default
        if value is None:
            raise UnsupportedModel(f"model config (model_type {self.family}) lacks {key!r}")
        return positive_int(key, value)

    def optional(self, key: str) -> int | None:
        return None if self.raw(key) is None else self.positive(key)

    def count(self, key: str, default: int = 0) -> int:
        """A count that may be 0 (shared experts, dense first layers)."""
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= DEFAULT_MAX_VALUE:
            raise UnsupportedModel(f"model config {key}={show(value)} is not a count")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise UnsupportedModel(f"model config {key}={show(value)} is not true or false")
        return value

    def number(self, key: str) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 2**40:
            raise UnsupportedModel(f"model config {key}={show(value)} is not a positive number")
        return float(value)

    def strings(self, key: str) -> list[str] | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise UnsupportedModel(f"model config {key}={show(value)} is not a list of strings")
        return value

    def layer_numbers(self, key: str) -> list[int]:
        value = self.raw(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(type(item) is int and item >= 0 for item in value):
            raise UnsupportedModel(f"model config {key}={show(value)} is not a list of layer numbers")
        return value

    def mapping(self, key: str) -> Mapping[str, Any] | None:
        value = self.values.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise UnsupportedModel(f"model config {key}={show(value)} is not an object")
        return value


def positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedModel(f"model config {key}={show(value)} is not a positive integer")
    bound = MAX_CONFIG_VALUES.get(key, DEFAULT_MAX_VALUE)
    if value > bound:
        raise UnsupportedModel(
            f"model config {key}={show(value)} is beyond any real model (at most {bound}); check the config"
        )
    return value


def model_type(config: Mapping[str, Any]) -> str | None:
    family = config.get("model_type")
    return family if isinstance(family, str) and family else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's settings: a multimodal config nests them in `text_config` (Gemma 3, Mistral 3, ...)."""
    nested = config.get("text_config")
    if nested is None:
        return config
    if not isinstance(nested, Mapping):
        raise UnsupportedModel(f"model config text_config={show(nested)} is not an object")
    return nested


def show(value: object) -> str:
    """A config value for a message, cut short: a garbage value can be arbitrarily long (and repr() refuses
    integers of more than 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"(a {value.bit_length()}-bit integer)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def first_present(config: ConfigView, keys: Iterable[str]) -> str | None:
    return next((key for key in keys if config.has(key)), None)


# The config keys that count a checkpoint's multi-token-prediction (MTP) layers, beyond num_hidden_layers: DeepSeek
# V3, GLM-4.5, MiMo and ERNIE 4.5 name them one way, Qwen3-Next the other (vLLM's config/speculative.py reads both).
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def mtp_layers(config: Mapping[str, Any]) -> int:
    """The checkpoint's MTP layers (0: none), from its config or its text_config; a value that is no count is 0."""
    for view in (config, text_config(config)):
        for key in MTP_LAYER_KEYS:
            value = view.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 16:
                return value
    return 0


def architecture(config: Mapping[str, Any]) -> str | None:
    """The config's first architecture (vLLM keys a model's class, and its MTP drafter, on it)."""
    found = config.get("architectures")
    first = found[0] if isinstance(found, list) and found else None
    return first if isinstance(first, str) and first else None
