"""What a plan runs slower than the nodes or the model allow (core/cautions.py), planned on the node shapes a
first hour meets, through plan_service and decide: the plan's cautions and the Warning conditions they become."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cpullm.core.children.common import Owner
from cpullm.core.decision import decide
from cpullm.core.observation import Observed
from cpullm.core.planner import plan_service

from .builders import llama_8b, node, spec

AVX2 = ("AVX", "AVX2", "FMA3")
AVX512_NO_BF16 = ("AVX2", "AVX512F", "AVX512BW", "AVX512VL")
ZEN4 = ("AVX2", "AVX512F", "AVX512BW", "AVX512VL", "AVX512BF16")
ARM_NO_BF16 = ("ASIMD", "SVE")
ARM_BF16 = ("ASIMD", "SVE", "BF16")


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
