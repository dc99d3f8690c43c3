"""The mixers hybrid families are built of, as vLLM's layers shape them: Mamba2 (mamba_mixer2.py), attention's
projections, a short convolution (short_conv.py), and the KV groups their layers make. The families (hybrids.py,
nemotron_h.py, lfm2.py) read their configs' own keys into these.

Shapes, with h = hidden_size:
  Mamba2 mixer    in_proj: h x (2 I + 2 G N + H)   out_proj: I x h   conv1d: (I + 2 G N) x kernel (+ bias)
                  A, D, dt_bias: H   norm: I (where gated)            with I = the mixer's width, G groups, N state,
                  H heads of P = I / H; state per sequence: conv (kernel - 1) x (I + 2 G N), temporal H x P x N
  short conv      in_proj: C x 3 C   out_proj: C x C   conv: C x L (+ biases)   with C = conv_dim, L = conv_L_cache;
                  state per sequence: conv (L - 1) x C, no temporal state
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cpullm.core.sizing.anatomy import KVGroup, LayerKind, Split, StateShape
from cpullm.core.sizing.config import ConfigView
from cpullm.core.sizing.layers import Parts, attention_heads, listed_layer_kinds

# Names a config's layer_types gives each layer, by what they are (transformers remaps the old names, "mamba" and
# "attention", to the new ones, "linear_attention" and "full_attention", as it loads: vLLM reads them so).
LAYER_NAMES = {
    "linear_attention": LayerKind.STATE,
    "mamba": LayerKind.STATE,
    "full_attention": LayerKind.FULL,
    "attention": LayerKind.FULL,
    "chunked_attention": LayerKind.CHUNKED,
}
# Pages of its state a sequence takes, per mixer, under prefix caching's align mode (vLLM's default): the running
# state and the last block's, and Mamba2's prefill checkpoint (MambaMixer2.get_kv_cache_spec).
MAMBA2_PAGES = 3
GATED_DELTANET_PAGES = 2
SHORT_CONV_PAGES = 2


def hybrid_layer_kinds(config: ConfigView, layers: int, default: Callable[[int], LayerKind]) -> list[LayerKind]:
    """Each layer's kind from `layer_types`, else the family's pattern."""
    sized = f"{config.family} layers are {', '.join(sorted(LAYER_NAMES))}"
    listed = listed_layer_kinds(config, layers, LAYER_NAMES, sized)
    return listed if listed is not None else [default(i) for i in range(layers)]


@dataclass(frozen=True)
class Mamba2:
    """A Mamba2 mixer's sizes, from the family's config keys."""

    width: int
    heads: int
    head_dim: int
    groups: int
    state: int
    kernel: int
    conv_bias: bool
    gated_norm: bool
    bias: bool = False  # in_proj's and out_proj's (Nemotron-H's use_bias)
    ssm_dtype: str = "auto"

    def add(self, parts: Parts, name: str, h: int, layers: int) -> StateShape:
        conv = self.width + 2 * self.groups * self.state
        parts.linear(f"{name}.in_proj", h, self.width + conv + self.heads, layers, Split.COLUMN)
        parts.linear(f"{name}.out_proj", self.width, h, layers, Split.ROW)
        parts.param(f"{name}.conv1d", layers * conv * (self.kernel + self.conv_bias))
        parts.param(f"{name} A, D, dt_bias", layers * 3 * self.heads)
        parts.param(f"{name}.norm", layers * self.width * self.gated_norm)
        parts.param(f"{name} projection biases", layers * (self.width + conv + self.heads + h) * self.bias)
        return StateShape(
            "mamba2", self.kernel - 1, self.width, self.groups, self.state, self.heads, self.head_dim, self.state,
            MAMBA2_PAGES, self.ssm_dtype,
        )  # fmt: skip


def add_attention(
    parts: Parts,
    h: int,
    shape: tuple[int, int, int],
    layers: int,
    *,
    bias: bool = False,
    q_gate: bool = False,
    prefix: str = "self_attn",
    out: str = "o_proj",
) -> None:
    """q, k, v and the output projection (`out`, under the family's module `prefix`) of `layers` attention layers of
    `shape` (heads, KV heads, head_dim; q twice as wide where its output is gated: Qwen3-Next)."""
    heads, kv_heads, d = shape
    parts.linear(f"{prefix}.q_proj", h, heads * d * (2 if q_gate else 1), layers, Split.HEADS)
    parts.linear(f"{prefix}.k_proj", h, kv_heads * d, layers, Split.HEADS)
    parts.linear(f"{prefix}.v_proj", h, kv_heads * d, layers, Split.HEADS)
    parts.linear(f"{prefix}.{out}", heads * d, h, layers, Split.ROW)
    parts.param("attention biases", layers * ((heads * (2 if q_gate else 1) + 2 * kv_heads) * d + h) * bias)


def attention_projections(
    parts: Parts, config: ConfigView, h: int, layers: int, q_gate: bool = False
) -> tuple[int, int, int]:
    """The attention layers of a config that names its heads as most do (head_dim, attention_bias)."""
    shape = attention_heads(config)
    add_attention(parts, h, shape, layers, bias=config.flag("attention_bias", False), q_gate=q_gate)
    return shape


def layer_groups(
    kinds: Sequence[LayerKind], kv_heads: int, entry: int, state: StateShape | None, window: int | None = None
) -> tuple[KVGroup, ...]:
    """One KV group per kind present, in the order vLLM's layers come (attention kinds, then states); `window`:
    the chunk of CHUNKED layers, or the window of SLIDING ones."""
    groups = []
    for kind in (LayerKind.CHUNKED, LayerKind.SLIDING, LayerKind.FULL, LayerKind.STATE):
        count = kinds.count(kind)
        if not count:
            continue
        if kind == LayerKind.STATE:
            groups.append(KVGroup(kind, count, 0, 0, state=state))
        else:
            windowed = kind in (LayerKind.CHUNKED, LayerKind.SLIDING)
            groups.append(KVGroup(kind, count, kv_heads, entry, window=window if windowed else None))
    return tuple(groups)


def short_conv(parts: Parts, name: str, width: int, kernel: int, bias: bool, layers: int) -> StateShape:
    """LFM2's short convolution of `width` channels (ShortConv): in_proj to B, C and x, a depthwise convolution of
    `kernel` taps, out_proj; its state is the last kernel - 1 inputs of each channel."""
    parts.linear(f"{name}.in_proj", width, 3 * width, layers, Split.COLUMN)
    parts.linear(f"{name}.out_proj", width, width, layers, Split.ROW)
    parts.param(f"{name}.conv", layers * width * kernel)
    parts.param(f"{name} biases", layers * 5 * width * bias)
    return StateShape("short_conv", kernel - 1, width, 0, 0, 0, 0, 0, SHORT_CONV_PAGES)
