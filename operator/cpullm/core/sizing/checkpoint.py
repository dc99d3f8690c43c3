"""A checkpoint's real bytes, from its safetensors headers (the Hub serves them with range requests): every
tensor's dtype and shape, summed by storage dtype and by the decoder layer it belongs to, so that sizing can
cast floating point tensors to the serving dtype and leave out layers vLLM does not load (DeepSeek-V3's
multi-token-prediction layer sits beyond num_hidden_layers)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

# safetensors dtype names and their bytes per element.
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2,
    "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}  # fmt: skip
# Tensors in these dtypes are cast to the serving dtype at load; the others (packed integers, 8-bit floats and
# their scales) stay as stored.
FLOATING = frozenset({"F64", "F32", "F16", "BF16"})
_DECODER_LAYER = re.compile(r"(?:^|\.)(?:model|language_model)\.layers\.(\d+)\.")
MAX_TENSORS = 2_000_000
# Decoder layers a checkpoint's tensor names may number (the largest models have ~130, with their MTP layers): the
# sums are keyed by layer, and a header naming a new layer per tensor would grow them by a key per tensor.
MAX_LAYERS = 1024


class CheckpointUnreadable(ValueError):
    """A header that is not a checkpoint: sizing falls back to the index's total or the family formula."""


@dataclass(frozen=True)
class CheckpointTensors:
    """Element counts per (safetensors dtype, decoder layer index or -1 for tensors outside the layers)."""

    elements: tuple[tuple[str, int, int], ...]
    files: int
    tensors: int

    def weights_bytes(self, layers: int, serving_dtype_bytes: int) -> int:
        total = 0
        for dtype, layer, count in self.elements:
            if layer >= layers:
                continue  # not loaded for serving
            total += count * (serving_dtype_bytes if dtype in FLOATING else DTYPE_BYTES[dtype])
        return total

    def describe(self) -> str:
        return f"safetensors headers ({self.files} file{'s' * (self.files != 1)}, {self.tensors} tensors)"


def summarize(tensors: Iterable[tuple[str, str, Iterable[int]]], files: int) -> CheckpointTensors:
    """(name, dtype, shape) of every tensor in the checkpoint's files -> CheckpointTensors."""
    sums: dict[tuple[str, int], int] = {}
    count = 0
    for name, dtype, shape in tensors:
        count += 1
        if count > MAX_TENSORS:
            raise CheckpointUnreadable(f"more than {MAX_TENSORS} tensors")
        if dtype not in DTYPE_BYTES:
            raise CheckpointUnreadable(f"tensor {name[:80]!r} has dtype {str(dtype)[:20]!r}")
        dims = list(shape)
        if not all(type(d) is int and 0 <= d < 2**40 for d in dims) or len(dims) > 8:
            raise CheckpointUnreadable(f"tensor {name[:80]!r} has shape {str(dims)[:60]}")
        if name.endswith(".g_idx"):
            continue  # GPTQ's act-order index: vLLM creates none (it refuses act-order with groups)
        match = _DECODER_LAYER.search(name)
        layer = int(match.group(1)) if match else -1
        if layer >= MAX_LAYERS:
            raise CheckpointUnreadable(f"tensor {name[:80]!r} names layer {layer}: more than {MAX_LAYERS} layers")
        key = (dtype, layer)
        sums[key] = sums.get(key, 0) + math.prod(dims)
    if not count:
        raise CheckpointUnreadable("no tensors")
    return CheckpointTensors(tuple((d, layer, n) for (d, layer), n in sorted(sums.items())), files, count)
