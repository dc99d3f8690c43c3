"""What a plan runs slower than the nodes or the model allow (core/cautions.py), planned on the node shapes a
first hour meets, through plan_service and decide: the plan's cautions and the Warning conditions they become."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cpullm.api.spec import DType
from cpullm.core.cautions import DECODE_BY_CHECKPOINT, DecodeSpeed, faster_checkpoints
from cpullm.core.children.common import Owner
from cpullm.core.decision import decide
from cpullm.core.observation import Observed
from cpullm.core.planner import plan_service
from cpullm.core.sizing import ModelSize, size_model

from .builders import llama_8b, node, spec

AVX2 = ("AVX", "AVX2", "FMA3")
AVX512_NO_BF16 = ("AVX2", "AVX512F", "AVX512BW", "AVX512VL")
ZEN4 = ("AVX2", "AVX512F", "AVX512BW", "AVX512VL", "AVX512BF16")
ARM_NO_BF16 = ("ASIMD", "SVE")
ARM_BF16 = ("ASIMD", "SVE", "BF16")
MODELS = Path(__file__).parent / "fixtures" / "models"


def fixture_model(name: str) -> ModelSize:
    return size_model(json.loads((MODELS / f"{name}.json").read_text()), DType.BFLOAT16)


@pytest.mark.parametrize(
    ("node_fields", "spec_fields", "cautions"),
    [
        pytest.param({"flags": AVX2}, {}, ["BF16WithoutNativeArithmetic"], id="AVX2-only: bf16 widened"),
        pytest.param({"flags": AVX512_NO_BF16}, {}, ["BF16WithoutNativeArithmetic"], id="AVX-512 without BF16"),
        pytest.param({"flags": ZEN4}, {}, [], id="Zen 4: AVX512_BF16"),
        pytest.param({}, {}, [], id="AMX"),
        pytest.param(
            {"flags": AVX2}, {"model": {"name": "m", "dtype": "float32"}}, [], id="AVX2 float32: nothing widened"
        ),
        pytest.param({"flags": ()}, {}, [], id="ISA not labelled: nothing claimed"),
        pytest.param({"arch": "arm64", "flags": ARM_NO_BF16}, {}, ["BF16WithoutNativeArithmetic"], id="arm64 no BF16"),
        pytest.param({"arch": "arm64", "flags": ARM_BF16}, {}, [], id="arm64 with BF16"),
        pytest.param(
            {"numa": 2},
            {"tensorParallelSize": 1, "cpu": {"cpusPerRank": 40}},
            ["RankSpansNUMANodes"],
            id="rank bigger than a NUMA",
        ),
        pytest.param({"numa": 2}, {"tensorParallelSize": 1}, [], id="TP 1 takes one NUMA node's CPUs"),
        pytest.param({"numa": 2}, {}, [], id="one rank per NUMA node"),
        pytest.param(
            {"numa": 2, "cpu": "96"},
            {"tensorParallelSize": 4, "cpu": {"threadsBind": "nobind"}},
            [],
            id="4 ranks of 24 on 2 NUMA nodes of 48: each within one",
        ),
        pytest.param(
            {"numa": 2, "cpu": "96"},
            {"tensorParallelSize": 3, "cpu": {"threadsBind": "nobind"}},
            [],
            id="TP 3 refused by vLLM's head rule is not a caution",
        ),
        pytest.param(
            {"numa": 4, "cpu": "96", "flags": AVX2},
            {"placement": "throughput", "tensorParallelSize": None},
            ["BF16WithoutNativeArithmetic"],
            id="throughput: each server on its NUMA node",
        ),
    ],
)
def test_cautions_per_node_shape(node_fields: dict[str, Any], spec_fields: dict[str, Any], cautions: list[str]):
    try:
        plan = plan_service(spec(**spec_fields), llama_8b(), [node("n1", **{"memory": "512Gi", **node_fields})])
    except Exception as refused:  # a plan that cannot be made has no cautions: its refusal says enough
        assert cautions == [], refused
        return
    assert [c.reason for c in plan.cautions or []] == cautions


def test_a_rank_across_numa_nodes_names_the_fix():
    plan = plan_service(
        spec(tensorParallelSize=1, cpu={"cpusPerRank": 40}), llama_8b(), [node("n1", numa=2, memory="512Gi")]
    )
    (caution,) = plan.cautions or []
    assert caution.condition == "NUMAAligned"
    assert "each rank's 40 CPUs are more than a NUMA node has (32)" in caution.message
    assert "set cpu.cpusPerRank to at most 32 (or a divisor of it), or tensorParallelSize 2" in caution.message


def test_ranks_that_do_not_divide_the_numa_nodes_straddle_one():
    plan = plan_service(
        spec(tensorParallelSize=4, cpu={"threadsBind": "nobind", "cpusPerRank": 20}),
        llama_8b(),
        [node("n1", numa=2, cpu="96", memory="512Gi")],
    )
    assert [c.reason for c in plan.cautions or []] == ["RankSpansNUMANodes"]
    assert "4 ranks of 20 CPUs do not divide NUMA nodes of 48" in (plan.cautions or [])[0].message


def test_cautions_are_warning_conditions_present_only_while_they_hold():
    owner = Owner(name="llama", namespace="serving", uid="u1")
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def observed(flags: tuple[str, ...], status: Any = None) -> Observed:
        nodes = (node("n1", numa=2, memory="512Gi", flags=flags),)
        return Observed(
            owner=owner,
            generation=1,
            spec=spec(),
            requested_replicas=1,
            model=llama_8b(),
            nodes=nodes,
            status=status or {},
        )

    slow = decide(observed(AVX2), now)
    (bf16,) = [c for c in slow.status["conditions"] if c["type"] == "NativeBF16"]
    assert (bf16["status"], bf16["reason"]) == ("False", "BF16WithoutNativeArithmetic")
    assert "cpu.requiredISA: [avx512_bf16]" in bf16["message"]
    assert ("Warning", "BF16WithoutNativeArithmetic") in [(e.type, e.reason) for e in slow.events]
    assert slow.status["plan"]["cautions"][0]["condition"] == "NativeBF16"
    fixed = decide(observed(ZEN4, slow.status), now)
    assert "NativeBF16" not in [c["type"] for c in fixed.status["conditions"]]
    assert "cautions" not in fixed.status["plan"] and fixed.status_patch["plan"]["cautions"] is None


AVX512_FACT = DecodeSpeed(False, "avx512f", "W8A8 int8", 2.0, "here")


@pytest.mark.parametrize(
    ("native", "isa", "facts", "named"),
    [
        pytest.param(False, {"avx512f"}, (AVX512_FACT,), ["W8A8 int8"], id="measured on cores like these"),
        pytest.param(False, {"avx2"}, (AVX512_FACT,), [], id="not measured on AVX2: nothing claimed"),
        pytest.param(True, {"avx512f"}, (AVX512_FACT,), [], id="bf16 arithmetic: another class of cores"),
        pytest.param(False, {"avx512f"}, (replace(AVX512_FACT, vs_bf16=1.2),), [], id="20% faster is not much faster"),
        pytest.param(
            False,
            {"avx512f"},
            (AVX512_FACT, replace(AVX512_FACT, checkpoint="AWQ int4", vs_bf16=3.0)),
            ["AWQ int4", "W8A8 int8"],
            id="fastest first",
        ),
    ],
)
def test_other_checkpoints_are_named_only_where_measured_much_faster(native, isa, facts, named):
    assert [f.checkpoint for f in faster_checkpoints(native, frozenset(isa), facts)] == named


@pytest.mark.parametrize(
    ("flags", "model_name", "advice"),
    [
        pytest.param(AVX512_NO_BF16, None, True, id="AVX-512 without BF16, bf16 weights: int8 named"),
        pytest.param(AVX2, None, False, id="AVX2: the caution, no ratio measured there"),
        pytest.param(AVX512_NO_BF16, "qwen2.5-1.5b-instruct-gptq-int4", False, id="already quantized"),
    ],
)
def test_the_bf16_caution_names_a_faster_checkpoint_with_its_measured_ratio(flags, model_name, advice):
    model = llama_8b() if model_name is None else fixture_model(model_name)
    plan = plan_service(spec(kvCacheGiB=1, maxModelLen=4096), model, [node("n1", memory="512Gi", flags=flags)])
    (caution,) = [c for c in plan.cautions or [] if c.reason == "BF16WithoutNativeArithmetic"]
    best = faster_checkpoints(False, frozenset({"avx512f"}))[0]
    said = f"serve a {best.checkpoint} checkpoint of the same model (model.name): it decoded one sequence "
    assert (said + f"{best.vs_bf16:.1f}x as fast as bf16" in caution.message) is advice


def test_the_measured_decode_speeds_are_the_table_docs_benchmarks_shows():
    docs = (Path(__file__).parents[2] / "docs" / "benchmarks.md").read_text()
    for fact in DECODE_BY_CHECKPOINT:
        row = f"| {fact.cores_with} | {'yes' if fact.native_bf16 else 'no'} | {fact.checkpoint} | {fact.vs_bf16}x |"
        assert row in docs, row
