"""A model sized by vLLM itself: what cpullm/meta_size.py printed after vLLM built the model on the meta device,
read into the Anatomy the rest of sizing and the planner use. This is the way for configs the formulas do not know
(a family or a layer pattern no builder here reads): the KV groups are vLLM's own specs, the weights the bytes vLLM
holds. What the report cannot say is approximated and the plan says so: weights split evenly between ranks, a
state's channels split evenly (vLLM widens a Mamba2 state's single group per rank), and the temporal state's
dtype as vLLM settled it where it ran."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from cpullm.core.sizing.anatomy import EMBEDDING, Anatomy, KVGroup, LayerKind, Params, StateShape
from cpullm.errors import UnsupportedModel
from cpullm.meta_size import REPORT

# Builds the model with vLLM from its config in a dtype ("bfloat16") and returns the report (io/meta_size.py runs the
# script): the seam through which sizing asks vLLM.
VllmSizer = Callable[[Mapping[str, Any], str], Mapping[str, Any]]
# vLLM's KV cache spec classes (v1/kv_cache_interface.py) by the layer kind sizing gives them.
SPEC_KINDS = {
    "FullAttentionSpec": LayerKind.FULL,
    "SlidingWindowSpec": LayerKind.SLIDING,
    "ChunkedLocalAttentionSpec": LayerKind.CHUNKED,
    "MLAAttentionSpec": LayerKind.MLA,
    "MambaSpec": LayerKind.STATE,
}
_MAX = 1 << 50
# A report is a few hundred bytes (cpullm/meta_size.py keeps it under a termination message's 4096); anything longer
# is not one.
REPORT_MAX_CHARS = 16384


def report_from_text(text: object) -> Mapping[str, Any] | None:
    """The report in what meta_size.py wrote (its last REPORT line: a Job's termination message, a log), or None
    where there is none (the process died first)."""
    if not isinstance(text, str) or len(text) > REPORT_MAX_CHARS:
        return None
    lines = [line for line in text.splitlines() if line.startswith(REPORT)]
    return parse_report(lines[-1][len(REPORT) :]) if lines else None


def parse_report(text: object) -> Mapping[str, Any] | None:
    """A report's JSON (as status.vllmSizing keeps it), or None where it is not one."""
    if not isinstance(text, str) or len(text) > REPORT_MAX_CHARS:
        return None
    try:
        report = json.loads(text)
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _count(report: Mapping[str, Any], key: str, what: str = "vLLM's sizing report") -> int:
    value = report.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX:
        raise UnsupportedModel(f"{what} has {key}={value!r}, not a count")
    return value


def _state(group: Mapping[str, Any]) -> StateShape:
    """A MambaSpec's shapes at TP 1: a conv state (rows x channels, the smaller side the rows) and, where the mixer
    has one, a temporal state (heads x a x b)."""
    shapes, dtypes = group.get("shapes"), group.get("dtypes")
    if not isinstance(shapes, list) or not shapes or not isinstance(dtypes, list) or len(dtypes) != len(shapes):
        raise UnsupportedModel(f"vLLM's sizing report has a state of shapes {shapes!r} and dtypes {dtypes!r}")
    sizes = [[_count({"size": n}, "size") for n in shape] if isinstance(shape, list) else [] for shape in shapes]
    conv = sizes[0]
    if len(conv) != 2:
        raise UnsupportedModel(f"vLLM's sizing report has a conv state of shape {conv!r}")
    temporal = sizes[1] if len(sizes) > 1 else [0, 0, 0]
    if len(temporal) != 3:
        raise UnsupportedModel(f"vLLM's sizing report has a temporal state of shape {temporal!r}")
    heads, head_a, head_b = temporal
    return StateShape(
        mixer=str(group.get("mixer", "state")).lower(),
        conv_rows=min(conv),
        conv_channels=max(conv),
        groups=0,
        state_size=0,
        heads=heads,
        head_a=head_a,
        head_b=head_b,
        pages_per_request=_count(group, "pages"),
        ssm_dtype=str(dtypes[1]) if len(dtypes) > 1 else "auto",
    )


def _groups(report: Mapping[str, Any]) -> tuple[tuple[KVGroup, ...], int | None]:
    """vLLM's KV groups as sizing's, and the KV heads of its attention layers (None: MLA's latent, or none)."""
    groups, kv_heads = [], None
    raw = report.get("groups")
    if not isinstance(raw, list):
        raise UnsupportedModel(f"vLLM's sizing report has groups={raw!r}, not a list")
    for group in raw:
        kind = SPEC_KINDS.get(str(group.get("spec"))) if isinstance(group, Mapping) else None
        if kind is None:
            raise UnsupportedModel(
                f"vLLM's sizing report has a KV cache spec {group!r} this operator does not lay out (it lays out "
                f"{', '.join(sorted(SPEC_KINDS))})"
            )
        layers = _count(group, "layers")
        if kind == LayerKind.STATE:
            groups.append(KVGroup(kind, layers, 0, 0, state=_state(group)))
            continue
        heads, size = _count(group, "kv_heads"), _count(group, "head_size")
        if kind == LayerKind.MLA:
            groups.append(KVGroup(kind, layers, 1, size))
            continue
        kv_heads = heads
        window = _count(group, "window") if kind in (LayerKind.SLIDING, LayerKind.CHUNKED) else None
        groups.append(KVGroup(kind, layers, heads, 2 * size, window=window))
    order = [LayerKind.CHUNKED, LayerKind.SLIDING, LayerKind.FULL, LayerKind.MLA, LayerKind.STATE]
    return tuple(sorted(groups, key=lambda g: order.index(g.kind))), kv_heads


def anatomy_from_report(family: str, report: Mapping[str, Any]) -> Anatomy:
    """The model as vLLM built it; raises UnsupportedModel with vLLM's words where vLLM refused it."""
    if "error" in report:
        raise UnsupportedModel(f"vLLM {report.get('vllm', '')} cannot build model_type {family!r}: {report['error']}")
    groups, kv_heads = _groups(report)
    parameters, vocabulary = _count(report, "parameters"), _count(report, "vocabulary")
    hidden = _count(report, "hidden_size") if "hidden_size" in report else 0
    # The parameters as one count: the planner reads weights from the report's bytes, not from the parts.
    params = [Params(f"parameters vLLM holds (vLLM {report.get('vllm')})", max(0, parameters - vocabulary * hidden))]
    params += [Params(EMBEDDING, vocabulary * hidden)] if hidden else []
    return Anatomy(
        family=family,
        linears=(),
        params=tuple(params),
        kv_groups=groups,
        attention_heads=_count(report, "attention_heads"),
        kv_heads=kv_heads,
        max_context=_count(report, "max_context") or None,
        vocabulary=vocabulary or None,
        decoder_layers=_count(report, "layers") or None,
        tensor_parallel_refusals=_refusals(report),
        notes=(
            f"sized by vLLM {report.get('vllm')} on the meta device: weights as vLLM holds them, split evenly between "
            "ranks; the KV layout from vLLM's own specs",
        ),
    )


def _refusals(report: Mapping[str, Any]) -> tuple[tuple[int, str], ...]:
    """The tensor parallel sizes vLLM's own check refused, with its words."""
    answers = report.get("tensor_parallel")
    if not isinstance(answers, Mapping):
        return ()
    return tuple(
        (int(size), answer) for size, answer in answers.items() if str(size).isdigit() and isinstance(answer, str)
    )
