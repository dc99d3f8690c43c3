"""Quantized checkpoints as vLLM's CPU backend serves them: the bytes a quantized weight matrix keeps resident
(packed weights, scales, zero points), which matrices a method leaves in the serving
dtype, what a node's CPU must have for the method's kernels, and the shapes tensor parallelism must keep.

One WeightFormat describes every method read here (AWQ, GPTQ, compressed-tensors, FP8, MXFP4): bits per weight,
and how scales are laid out (per group of inputs, per output channel, per tensor, or per 2-D block).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cpullm.core.sizing.anatomy import Anatomy, Linear, Split
from cpullm.core.sizing.config import show
from cpullm.errors import UnsupportedModel

# vLLM CPU (0.32) gates kernels on AMX tiles (torch's _is_amx_tile_supported; NFD's AMXTILE): MXFP4 MoE, FP8
# linear and MoE layers, and quantized MoE experts of every method run on AMX only. int8 W8A8 linear layers also run
# without it. 4-bit linear layers (AWQ, GPTQ, compressed-tensors W4A16: the CPUWNA16 kernel) need AVX-512: the x86
# wheel loads one of three kernel libraries by the CPU's flags (platforms/cpu.py import_kernels: _C with AVX-512 and
# AVX512-BF16, _C_AVX512, else _C_AVX2), and cpu_gemm_wna16 is not in _C_AVX2 (read from the 0.32.0 wheel's
# libraries; on an AVX2-only EPYC the GPTQ model of tests/vllm failed with "'_C' object has no attribute
# 'cpu_gemm_wna16'").
AMX = "amx_tile"
AVX512 = "avx512f"
# What torch.cpu._is_avx512_bf16_supported reads: vLLM CPU keeps a state-space layer's temporal state in float32
# where it is set (vllm/platforms/cpu.py).
BF16_ARITHMETIC = "avx512_bf16"
# What vLLM CPU's FP8 MoE experts take (fused_moe/experts/cpu_moe.py, CPUExpertsFp8 and CPUExpertsFp8W8A8): 128x128
# blocks, and these routing methods (RoutingMethodType names).
FP8_MOE_BLOCK = (128, 128)
FP8_MOE_ROUTING = frozenset({"Default", "Renormalize", "RenormalizeNaive", "DeepSeekV3", "DeepseekV4"})
WNA16_METHODS = ("awq", "gptq", "compressed-tensors")
METHODS = ("awq", "gptq", "compressed-tensors", "fp8", "mxfp4")


@dataclass(frozen=True)
class WeightFormat:
    """How a quantized checkpoint stores one weight matrix of in x out."""

    method: str
    bits: int
    group_size: int | None = None  # inputs sharing one scale; None: see per_channel
    per_channel: bool = True  # one scale per output (when no group); False: one per tensor
    zero_points: bool = False  # stored at `bits` per group and output
    scale_bytes: int = 2
    block: tuple[int, int] | None = None  # FP8 block quantization: one fp32 scale per (out, in) block
    experts_only: bool = False  # MXFP4 (gpt-oss): attention stays in the serving dtype
    excluded: tuple[str, ...] = ()  # module patterns left unquantized (modules_to_not_convert, ignore)
    activations: str | None = None  # "int8" for W8A8

    def describe(self) -> str:
        parts = [self.method] if self.method in ("fp8", "mxfp4") else [self.method, f"int{self.bits}"]
        if self.activations:
            parts.append(f"a8 {self.activations}")
        if self.block:
            parts.append(f"block {self.block[0]}x{self.block[1]}")
        elif self.group_size:
            parts.append(f"group {self.group_size}")
        else:
            parts.append("per-channel" if self.per_channel else "per-tensor")
        if self.experts_only:
            parts.append("experts only")
        return " ".join(parts)

    def quantizes(self, linear: Linear) -> bool:
        if self.experts_only and not linear.expert:
            return False
        return not any(_matches(pattern, linear.name) for pattern in self.excluded)

    def linear_bytes(self, linear: Linear) -> int:
        """Resident bytes of one matrix of the linear's shape, packed as the checkpoint stores it."""
        fan_in, fan_out = linear.in_features, linear.out_features
        weights = math.ceil(fan_in * fan_out * self.bits / 8)
        if self.block:
            scales = math.ceil(fan_out / self.block[0]) * math.ceil(fan_in / self.block[1])
        elif self.group_size:
            scales = math.ceil(fan_in / self.group_size) * fan_out
        else:
            scales = fan_out if self.per_channel else 1
        zeros = math.ceil(scales * self.bits / 8) if self.zero_points else 0
        return weights + scales * self.scale_bytes + zeros

    def model_problem(self, anatomy: Anatomy) -> str | None:
        """Why vLLM CPU cannot load this format for this model on any CPU, or None: its FP8 MoE kernel (W8A16 on AMX,
        W8A8 on AMX-FP8) takes experts quantized in 128x128 blocks, with SiLU, routed by softmax top-k or DeepSeek's
        grouped sigmoid with a bias (fused_moe/experts/cpu_moe.py)."""
        if self.method != "fp8" or not any(linear.expert and self.quantizes(linear) for linear in anatomy.linears):
            return None
        instead = "a BF16 checkpoint of the same model serves on CPU instead"
        if self.block != FP8_MOE_BLOCK:
            return f"vLLM CPU runs FP8 experts quantized in 128x128 blocks only, not {self.describe()}: {instead}"
        if anatomy.routing not in FP8_MOE_ROUTING:
            return (
                f"vLLM CPU's FP8 MoE kernel does not route as this model does ({anatomy.routing} routing; it routes "
                f"{', '.join(sorted(FP8_MOE_ROUTING))}): {instead}"
            )
        if anatomy.activation != "silu":
            return f"vLLM CPU's FP8 MoE kernel runs SiLU experts only, not {anatomy.activation}: {instead}"
        return None

    def kernel_problem(self, isa: frozenset[str], anatomy: Anatomy) -> str | None:
        """Why a node with these CPU flags cannot run this format in vLLM CPU, or None."""
        if AMX in isa:
            return None
        if self.method in ("fp8", "mxfp4"):
            return f"lacks {AMX} for {self.describe()} (vLLM CPU runs {self.method.upper()} layers on AMX only)"
        if any(linear.expert and self.quantizes(linear) for linear in anatomy.linears):
            return f"lacks {AMX} for {self.describe()} experts (vLLM CPU runs quantized MoE layers on AMX only)"
        if self.bits == 4 and self.method in WNA16_METHODS and AVX512 not in isa:
            return f"lacks {AVX512} for {self.describe()} (vLLM CPU's 4-bit kernel is in its AVX-512 builds only)"
        return None

    def tensor_parallel_problem(self, tp: int, anatomy: Anatomy) -> str | None:
        """The shapes vLLM CPU's quantized kernels need on each rank: whole quantization groups (or FP8 blocks) of
        a layer's inputs, and for the 4-bit kernels (CPUWNA16) slices that are multiples of 32."""
        if tp == 1:
            return None
        for linear in anatomy.linears:
            if linear.split not in (Split.ROW, Split.COLUMN) or not self.quantizes(linear):
                continue
            side, size = (
                ("inputs", linear.in_features) if linear.split == Split.ROW else ("outputs", linear.out_features)
            )
            part = size // tp
            for multiple, what in self._slice_multiples(linear.split):
                if part % multiple:
                    return (
                        f"tensor parallel size {tp} splits {linear.name}'s {size} {side} into {part} per rank, not a "
                        f"multiple of the {what}"
                    )
        return None

    def _slice_multiples(self, split: Split) -> list[tuple[int, str]]:
        if self.block:
            return [(self.block[1] if split == Split.ROW else self.block[0], f"{self.method} block size")]
        multiples = []
        if self.group_size and split == Split.ROW:
            multiples.append((self.group_size, f"{self.method} group size {self.group_size}"))
        if self.bits == 4 and not self.experts_only:
            multiples.append((WNA16_SLICE, f"{WNA16_SLICE} the 4-bit CPU kernel needs"))
        return multiples


# vLLM CPU's 4-bit linear kernel (CPUWNA16) takes input and output slices in multiples of 32.
WNA16_SLICE = 32


def _matches(pattern: str, name: str) -> bool:
    """A module pattern as quantization configs write them ("lm_head", "model.layers.*.self_attn",
    "re:.*mlp.gate$", "visual") against a module path within a layer ("self_attn.q_proj"), component by component
    ("mlp.gate" is the router, not "mlp.gate_proj"). A pattern naming one layer is taken for every layer."""
    if pattern.startswith("re:"):
        return re.search(pattern[3:], f"model.layers.0.{name}") is not None
    tail = [part for part in pattern.split(".") if part not in ("model", "layers", "*", "") and not part.isdigit()]
    parts = name.split(".")
    return bool(tail) and any(parts[i : i + len(tail)] == tail for i in range(len(parts) - len(tail) + 1))


def weight_format(config: Mapping[str, Any]) -> WeightFormat | None:
    """The checkpoint's quantization_config, or None for a model stored in a floating point dtype."""
    raw = config.get("quantization_config")
    if raw is None:
        text = config.get("text_config")
        raw = text.get("quantization_config") if isinstance(text, Mapping) else None
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise UnsupportedModel(f"model config quantization_config={show(raw)} is not an object")
    method = raw.get("quant_method")
    reader = _READERS.get(method) if isinstance(method, str) else None
    if reader is None:
        raise UnsupportedModel(
            f"quantization_config.quant_method {show(method)} is not one vLLM CPU serves here "
            f"({', '.join(METHODS)}); set spec.model.weightsBytes and check that vLLM CPU can load it"
        )
    return reader(_Quant(raw, str(method)))


@dataclass(frozen=True)
class _Quant:
    raw: Mapping[str, Any]
    method: str

    def integer(self, key: str, default: int, allowed: tuple[int, ...] = (), why: str = "") -> int:
        value = self.raw.get(key, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or (allowed and value not in allowed):
            choices = f" (one of {', '.join(map(str, allowed))}{': ' + why if why else ''})" if allowed else ""
            raise UnsupportedModel(
                f"quantization_config.{key}={show(value)} is not a valid {self.method} value{choices}"
            )
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise UnsupportedModel(f"quantization_config.{key}={show(value)} is not true or false")
        return value

    def patterns(self, *keys: str) -> tuple[str, ...]:
        out: list[str] = []
        for key in keys:
            value = self.raw.get(key)
            if value is None:
                continue
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise UnsupportedModel(f"quantization_config.{key}={show(value)} is not a list of module names")
            out.extend(value)
        return tuple(out)


def _group(quant: _Quant, key: str = "group_size") -> int | None:
    """A group size: -1 (or 0) means one group over all inputs, i.e. per output channel."""
    size = quant.integer(key, 128)
    if size < -1:
        raise UnsupportedModel(f"quantization_config.{key}={size} is not a group size")
    return size if size > 0 else None


def _awq(quant: _Quant) -> WeightFormat:
    # AWQ stores int4 weights packed eight to an int32, fp16 scales and packed zero points per group; vLLM CPU
    # repacks them at the same size.
    bits = quant.integer("bits", quant.integer("w_bit", 4), allowed=(4,), why="vLLM CPU runs AWQ at 4 bits only")
    group = _group(quant, "group_size" if "group_size" in quant.raw else "q_group_size")
    return WeightFormat(
        "awq",
        bits,
        group,
        zero_points=quant.flag("zero_point", True),
        excluded=quant.patterns("modules_to_not_convert"),
    )


def _gptq(quant: _Quant) -> WeightFormat:
    # GPTQ stores packed weights, fp16 scales and packed zero points (also when symmetric). vLLM CPU runs 4-bit
    # symmetric GPTQ only, with groups of 32, 64 or 128 inputs (or one per column), and refuses act-order with
    # groups; it drops the zero points of symmetric weights.
    why = "vLLM CPU runs GPTQ at 4 bits only (its 4-bit symmetric Marlin types)"
    bits = quant.integer("bits", 4, allowed=(4,), why=why)
    if not quant.flag("sym", True):
        raise UnsupportedModel(f"quantization_config.sym=false is not served: {why}")
    group = quant.integer("group_size", 128, allowed=(-1, 32, 64, 128), why="vLLM CPU's GPTQ group sizes")
    if quant.flag("desc_act", False) and group != -1:
        raise UnsupportedModel(
            "quantization_config.desc_act=true with groups is refused by vLLM (group activation ordering is no longer "
            "supported): use a checkpoint with desc_act=false"
        )
    return WeightFormat("gptq", bits, group if group > 0 else None, excluded=quant.patterns("modules_to_not_convert"))


def _fp8(quant: _Quant) -> WeightFormat:
    # FP8 weights, one byte each, with fp32 scales: per 2-D block (DeepSeek-V3: 128x128) or per tensor.
    block = quant.raw.get("weight_block_size")
    if block is not None and (
        not isinstance(block, list) or len(block) != 2 or not all(type(b) is int and b > 0 for b in block)
    ):
        raise UnsupportedModel(f"quantization_config.weight_block_size={show(block)} is not two block sizes")
    return WeightFormat(
        "fp8",
        8,
        per_channel=False,
        scale_bytes=4,
        block=(block[0], block[1]) if block else None,
        excluded=quant.patterns("modules_to_not_convert", "ignored_layers"),
    )


def _mxfp4(quant: _Quant) -> WeightFormat:
    # OCP MX: 4-bit e2m1 weights with one e8m0 (1-byte) scale per 32 inputs, on the MoE experts only.
    return WeightFormat(
        "mxfp4", 4, 32, scale_bytes=1, experts_only=True, excluded=quant.patterns("modules_to_not_convert")
    )


def _compressed_tensors(quant: _Quant) -> WeightFormat:
    """llm-compressor's format: the first config group's weight scheme (W8A8 int8, W4A16, FP8, ...)."""
    groups = quant.raw.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise UnsupportedModel("quantization_config.config_groups is missing or empty (compressed-tensors)")
    group = next(iter(groups.values()))
    weights = group.get("weights") if isinstance(group, Mapping) else None
    if not isinstance(weights, Mapping):
        raise UnsupportedModel("quantization_config.config_groups has no weights scheme (compressed-tensors)")
    scheme = _Quant(weights, "compressed-tensors")
    bits = scheme.integer("num_bits", 8, allowed=(4, 8), why="vLLM CPU's W4A16 and W8A8 kernels")
    kind = weights.get("type", "int")
    strategy = weights.get("strategy", "tensor")
    if kind not in ("int", "float") or strategy not in ("tensor", "channel", "group", "block"):
        raise UnsupportedModel(
            f"compressed-tensors weights type {show(kind)} strategy {show(strategy)} is not one sized here"
        )
    inputs = group.get("input_activations")
    activations = None
    if isinstance(inputs, Mapping) and inputs.get("num_bits") == 8:
        activations = "int8" if inputs.get("type", "int") == "int" else "fp8"
    if kind == "int" and bits == 8 and activations != "int8":
        raise UnsupportedModel(
            "compressed-tensors 8-bit weights without int8 activations (W8A16) have no vLLM CPU kernel"
        )
    block = weights.get("block_structure") if strategy == "block" else None
    if kind == "float":
        return WeightFormat(
            "fp8", 8, per_channel=strategy == "channel", scale_bytes=4,
            block=(block[0], block[1]) if isinstance(block, list) and len(block) == 2 else None,
            excluded=quant.patterns("ignore"),
        )  # fmt: skip
    return WeightFormat(
        "compressed-tensors",
        bits,
        _group(scheme) if strategy == "group" else None,
        per_channel=strategy != "tensor",
        zero_points=not scheme.flag("symmetric", True),
        excluded=quant.patterns("ignore"),
        activations=activations,
    )


_READERS = {
    "awq": _awq,
    "gptq": _gptq,
    "fp8": _fp8,
    "mxfp4": _mxfp4,
    "compressed-tensors": _compressed_tensors,
}
