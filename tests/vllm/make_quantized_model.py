"""Quantizes a bf16 model built by make_sized_model.py into the checkpoint formats vLLM's CPU backend serves, so the
decode benchmark can set bf16 against int8 and int4 at the same shapes (nothing is downloaded, no calibration):
round-to-nearest from the bf16 weights, which keeps the magnitudes (and so the activations) those of the bf16 model.
Only the decoder's linear layers (q/k/v/o, gate/up/down) are quantized; embeddings, norms, biases and lm_head stay
as they are, and the tokenizer and generation files are copied. Runs in the vLLM environment:
python make_quantized_model.py BF16_MODEL_DIR FORMAT OUT_DIR    (FORMAT: one of FORMATS)

w8a8-int8  compressed-tensors as llm-compressor writes it: int8 weights, symmetric per output channel, activations
           quantized per token at run time (vLLM CPU: CPUInt8ScaledMMLinearKernel).
awq-int4   AutoAWQ GEMM: 4-bit, group size 128, zero points (vLLM CPU: CPUWNA16LinearKernel). GPTQ 4-bit reaches the
           same kernel in vLLM 0.32, so it is left out.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

QUANTIZED = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")

W8A8_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "channel",
                "dynamic": False,
                "group_size": None,
                "observer": "minmax",
            },
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "token",
                "dynamic": True,
                "group_size": None,
                "observer": None,
            },
            "output_activations": None,
        }
    },
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
}
AWQ_GROUP = 128
AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": AWQ_GROUP, "zero_point": True, "version": "gemm"}
# AutoAWQ puts output column ORDER[i] of each run of eight into nibble i of the int32 (vLLM undoes this on load).
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def w8a8_int8(name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """`weight` [out, in] as int8 with one scale per output row (absmax / 127); the scale is kept in the model's
    dtype, as llm-compressor saves it, and the rounding uses that stored scale."""
    w = weight.float()
    scale = (w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127).to(weight.dtype)
    q = torch.round(w / scale.float()).clamp(-128, 127).to(torch.int8)
    return {name: q, name.removesuffix("weight") + "weight_scale": scale}


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """[rows, cols] of 4-bit values -> [rows, cols / 8] int32 in AutoAWQ's nibble order."""
    rows, cols = values.shape
    runs = values.to(torch.int64).view(rows, cols // 8, 8)[:, :, AWQ_ORDER]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    packed = (runs << shifts).sum(dim=2)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # the bit pattern as int32


def awq_int4(name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """`weight` [out, in] as AutoAWQ GEMM tensors: asymmetric 4-bit per group of AWQ_GROUP inputs (AutoAWQ's
    min/max rule), qweight [in, out/8], qzeros [in/group, out/8], scales [in/group, out] fp16."""
    out_features, in_features = weight.shape
    assert in_features % AWQ_GROUP == 0 and out_features % 8 == 0, (name, weight.shape)
    w = weight.float().view(out_features, in_features // AWQ_GROUP, AWQ_GROUP)
    high, low = w.amax(dim=2, keepdim=True), w.amin(dim=2, keepdim=True)
    scale = ((high - low).clamp(min=1e-5) / 15).half()
    zero = (-torch.round(low / scale.float())).clamp(0, 15)
    q = (torch.round(w / scale.float()) + zero).clamp(0, 15)
    prefix = name.removesuffix("weight")
    return {
        prefix + "qweight": pack_awq(q.view(out_features, in_features).t()),
        prefix + "qzeros": pack_awq(zero.squeeze(2).t()),
        prefix + "scales": scale.squeeze(2).t().contiguous(),
    }


FORMATS: dict[str, tuple[Callable[[str, torch.Tensor], dict[str, torch.Tensor]], dict[str, Any]]] = {
    "w8a8-int8": (w8a8_int8, W8A8_CONFIG),
    "awq-int4": (awq_int4, AWQ_CONFIG),
}


def main(bf16_dir: str, fmt: str, out_dir: str) -> None:
    quantize, quant_config = FORMATS[fmt]
    src, out = Path(bf16_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"quantization_config": quant_config}, indent=2))
    for path in src.iterdir():  # tokenizer and generation files
        if path.is_file() and path.suffix != ".safetensors" and path.name != "config.json":
            shutil.copy(path, out / path.name)
    weight_map: dict[str, str] = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                tensor = f.get_tensor(name)
                tensors |= quantize(name, tensor) if QUANTIZED.fullmatch(name) else {name: tensor}
        save_file(tensors, str(out / shard.name), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, shard.name)
    index = src / "model.safetensors.index.json"
    if index.exists():  # sharded: the new tensor names must point at their shards
        saved = json.loads(index.read_text())
        (out / index.name).write_text(json.dumps(saved | {"weight_map": weight_map}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
