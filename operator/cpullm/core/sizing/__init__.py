"""Model sizing as vLLM CPU serves a model: its families (families.py), quantized formats (quantization.py), the
checkpoint's real bytes (checkpoint.py) and the KV cache per layer kind (model.py)."""

from cpullm.core.sizing.checkpoint import CheckpointTensors, CheckpointUnreadable, summarize
from cpullm.core.sizing.config import MAX_CONFIG_VALUES
from cpullm.core.sizing.families import FAMILIES, anatomy_of
from cpullm.core.sizing.model import MAX_CHECKPOINT_BYTES, KVLayout, ModelFiles, ModelSize, formula_bytes, size_model

__all__ = [
    "FAMILIES",
    "MAX_CHECKPOINT_BYTES",
    "MAX_CONFIG_VALUES",
    "CheckpointTensors",
    "CheckpointUnreadable",
    "KVLayout",
    "ModelFiles",
    "ModelSize",
    "anatomy_of",
    "formula_bytes",
    "size_model",
    "summarize",
]
