"""A model sized by vLLM itself (core/sizing/vllm_report.py): the reports in fixtures/vllm_reports are what
cpullm/meta_size.py printed with vLLM 0.32 for configs of fixtures/models (tests/vllm/test_oracle.py checks the
path against vLLM's own KV capacity). Where a formula knows the family too, both paths must lay out the same KV
cache; a report sizing cannot read is refused, never guessed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cpullm.api.spec import DType
from cpullm.core.sizing import size_model
from cpullm.errors import NotSizedHere, UnsupportedModel, VllmCannotServe

FIXTURES = Path(__file__).parent / "fixtures"
BF16_NODE = frozenset({"avx512f", "avx512_bf16"})
GiB = 1 << 30


def report(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((FIXTURES / "vllm_reports" / f"{name}.json").read_text())
    return found


def model(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((FIXTURES / "models" / f"{name}.json").read_text())
    return found


VLLM_ONLY_GPT2 = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
    "n_positions": 1024, "vocab_size": 50257,
}  # fmt: skip


def answering(answer: dict[str, Any]):
    """A vLLM seam that answers `answer` and records what it was asked."""
    asked: list[tuple[dict[str, Any], str]] = []

    def sizer(config, dtype):
        asked.append((config, dtype))
        return answer

    sizer.asked = asked  # type: ignore[attr-defined]
    return sizer


def unknown(name: str) -> dict[str, Any]:
    """The fixture under a model_type no formula knows: only vLLM can size it."""
    return {**model(name), "model_type": f"{model(name)['model_type']}_fork"}


@pytest.mark.parametrize("name", ["lfm2-1.2b", "nemotron-h-8b-base-8k"])
def test_vllms_report_and_the_formula_lay_out_the_same_kv_cache(name):
    by_formula = size_model(model(name), DType.BFLOAT16)
    sizer = answering(report(name))
    by_vllm = size_model(unknown(name), DType.BFLOAT16, vllm=sizer)
    assert sizer.asked == [(unknown(name), "bfloat16")]
    assert by_vllm.weights_source == "vLLM 0.32.0 (meta device)"
    # Equal but for Mamba's A, D and dt_bias, which vLLM keeps in float32 (6 KB of Nemotron-H's 16 GB)
    assert abs(by_vllm.weights_bytes - by_formula.weights_bytes) <= 1e-6 * by_formula.weights_bytes
    assert by_vllm.parameters == by_formula.parameters
    for tp in (1, 2, 4):
        ours, theirs = by_formula.kv(None, BF16_NODE), by_vllm.kv(None, BF16_NODE)
        assert (theirs.block_tokens(tp), theirs.page_bytes(tp)) == (ours.block_tokens(tp), ours.page_bytes(tp))
        assert theirs.tokens(4 * GiB, tp, 8192) == ours.tokens(4 * GiB, tp, 8192)


def test_an_unknown_family_with_layers_that_are_not_attention_is_never_sized_as_a_llama():
    """Nemotron-H's fields under another model_type: the common fields are there, but so is its layer pattern."""
    with pytest.raises(UnsupportedModel, match="has hybrid_override_pattern: layers that are not attention"):
        size_model(unknown("nemotron-h-8b-base-8k"), DType.BFLOAT16)
    with pytest.raises(UnsupportedModel, match="has conv_L_cache"):
        size_model(unknown("lfm2-1.2b"), DType.BFLOAT16)


def test_a_model_sized_by_vllm_plans_its_context_heads_and_notes():
    size = size_model(unknown("lfm2-1.2b"), DType.BFLOAT16, vllm=answering(report("lfm2-1.2b")))
    assert (size.max_position_embeddings, size.num_attention_heads, size.num_layers) == (128_000, 32, 16)
    assert size.anatomy.kv_heads == 8
    assert "sized by vLLM 0.32.0 on the meta device" in size.anatomy.notes[0]
    assert size.tensor_parallel_problem(3) == "tensor parallel size 3 does not divide the 32 attention heads"


def test_a_pure_state_space_model_takes_one_page_a_sequence_without_prefix_caching():
    """Mamba2 2.7B: no attention, so no prefix caching, so one state page per sequence (vLLM's mode "none"): 25
    sequences of 2,048 tokens in 4 GiB (tests/vllm/test_oracle.py: vLLM's own count, 51,200 tokens)."""
    config = {"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"]}
    size = size_model(config, DType.BFLOAT16, vllm=answering(report("mamba2-2.7b")))
    kv = size.kv(None, BF16_NODE)
    assert kv.describe().startswith("64 mamba2 state")
    assert kv.tokens(4 * GiB, 1, 2048) == 51_200


def test_vllms_own_refusals_are_the_plans():
    refused = {**report("lfm2-1.2b"), "tensor_parallel": {"1": None, "2": "ValueError: Total number of attention"}}
    size = size_model(unknown("lfm2-1.2b"), DType.BFLOAT16, vllm=answering(refused))
    assert (
        size.tensor_parallel_problem(2) == "vLLM refuses tensor parallel size 2: ValueError: Total number of attention"
    )
    error = {"vllm": "0.32.0", "error": "ValueError: Model architectures ['Lfm2ForkForCausalLM'] are not supported"}
    with pytest.raises(UnsupportedModel, match=re.escape("vLLM 0.32.0 cannot build model_type 'lfm2_fork'")):
        size_model(unknown("lfm2-1.2b"), DType.BFLOAT16, vllm=answering(error))


def test_vllm_is_not_asked_about_what_it_cannot_serve_or_what_the_formulas_know():
    sizer = answering(report("lfm2-1.2b"))
    with pytest.raises(VllmCannotServe, match="selective-scan"):
        size_model({**model("llama-3.1-8b"), "model_type": "falcon_mamba"}, DType.BFLOAT16, vllm=sizer)
    size_model(model("lfm2-1.2b"), DType.BFLOAT16, vllm=sizer)
    with pytest.raises(UnsupportedModel):  # spec.model.weightsBytes: the user's word, no vLLM asked
        size_model({"model_type": "lfm2_fork"}, DType.BFLOAT16, weights_bytes=1 << 30, vllm=sizer)
    # A family the formulas know, with values that cannot be: refused as it is, not sent to vLLM.
    with pytest.raises(UnsupportedModel, match="hidden_size=8 is smaller than num_attention_heads") as refused:
        size_model({**model("llama-3.1-8b"), "hidden_size": 8}, DType.BFLOAT16, vllm=sizer, always_vllm=True)
    assert not isinstance(refused.value, NotSizedHere)
    assert sizer.asked == []


@pytest.mark.parametrize("config", [VLLM_ONLY_GPT2, {**VLLM_ONLY_GPT2, "model_type": "mamba2"}], ids=["gpt2", "mamba2"])
def test_what_the_formulas_do_not_know_is_theirs_to_say_so(config):
    """NotSizedHere, the one refusal a vLLM sizer answers instead: a family or pattern the formulas do not know."""
    with pytest.raises(NotSizedHere):
        size_model(config, DType.BFLOAT16)


def test_sized_by_vllm_asks_vllm_about_every_model_and_keeps_the_formulas_word_beside():
    """spec.model.sizedBy: vllm: a family the formulas know is sized by vLLM too; the plan's notes say how far the
    formulas' weights were from vLLM's. Without a vLLM to ask (the CLI without --vllm-python) the formulas size it
    and a note says vLLM was not asked; weightsBytes is the user's word over both."""
    sizer = answering(report("lfm2-1.2b"))
    by_formula = size_model(model("lfm2-1.2b"), DType.BFLOAT16)
    sized = size_model(model("lfm2-1.2b"), DType.BFLOAT16, vllm=sizer, always_vllm=True)
    assert sizer.asked == [(model("lfm2-1.2b"), "bfloat16")]
    assert (
        sized.weights_source == "vLLM 0.32.0 (meta device)"
        and sized.weights_bytes == report("lfm2-1.2b")["weights_bytes"]
    )
    share = by_formula.weights_bytes / sized.weights_bytes - 1
    assert sized.anatomy.notes[-1] == (
        f"the formulas' weights, {by_formula.weights_bytes / GiB:.2f} GiB from {by_formula.weights_source}, are "
        f"{share:+.1%} of vLLM's"
    )
    alone = size_model(model("lfm2-1.2b"), DType.BFLOAT16, always_vllm=True)
    assert alone.weights_bytes == by_formula.weights_bytes and "no vLLM was there to ask" in alone.anatomy.notes[-1]
    mine = size_model(model("lfm2-1.2b"), DType.BFLOAT16, weights_bytes=GiB, vllm=sizer, always_vllm=True)
    assert mine.weights_bytes == GiB and len(sizer.asked) == 1


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"groups": "many"}, "groups='many', not a list"),
        ({"groups": [{"spec": "CrossAttentionSpec", "layers": 2}]}, "a KV cache spec {'spec': 'CrossAttentionSpec'"),
        ({"groups": [{"spec": "FullAttentionSpec", "layers": -1, "kv_heads": 8, "head_size": 64}]}, "layers=-1"),
        ({"groups": [{"spec": "SlidingWindowSpec", "layers": 2, "kv_heads": 8, "head_size": 64}]}, "window=None"),
        ({"groups": [{"spec": "MambaSpec", "layers": 2, "shapes": [[2, 3, 4]], "dtypes": ["bfloat16"]}]}, "conv"),
        ({"weights_bytes": 0}, "weights_bytes=0, not a size"),
        ({"parameters": "lots"}, "parameters='lots', not a count"),
    ],
)
def test_a_report_sizing_cannot_read_is_refused_naming_what(change, refusal):
    with pytest.raises(UnsupportedModel, match=re.escape(refusal)):
        size_model(unknown("lfm2-1.2b"), DType.BFLOAT16, vllm=answering({**report("lfm2-1.2b"), **change}))


def test_the_script_without_vllm_reports_why_in_one_line(tmp_path, capsys):
    """cpullm/meta_size.py in a python without vLLM (this one): one report line carrying the error, no traceback; the
    CLI's seam turns it into vLLM's refusal."""
    from cpullm import meta_size

    (tmp_path / "config.json").write_text(json.dumps(model("lfm2-1.2b")))
    assert meta_size.main([str(tmp_path), "--tensor-parallel", "1,2"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    printed = json.loads(line.removeprefix(meta_size.REPORT))
    assert printed["vllm"] == "(none)" and printed["error"].startswith("ModuleNotFoundError")
    with pytest.raises(UnsupportedModel, match=re.escape("vLLM (none) cannot build model_type 'lfm2_fork'")):
        size_model(unknown("lfm2-1.2b"), DType.BFLOAT16, vllm=answering(printed))
