"""The planner's memos (core/planner.py): SHAPE_PLANS, the plans per shape, and SERVICE_PLANS, whole plans by their
inputs. What they return is what planning afresh makes, and a changed input is planned again."""

from __future__ import annotations

import dataclasses

import pytest

from cpullm.core.planner import SERVICE_PLANS, SHAPE_PLANS, forget_plans, plan_service
from cpullm.core.topology import PRICE_LABEL
from cpullm.errors import ModelTooLarge

from .builders import llama_8b, node, spec


def test_a_plan_made_again_from_the_memo_equals_one_made_afresh():
    nodes = [node("a", numa=2, cpu="64"), node("b", numa=1, cpu="32"), node("c", numa=2, cpu="64")]
    fresh = plan_service(spec(), llama_8b(), nodes)
    made = SHAPE_PLANS.misses, SERVICE_PLANS.misses
    again = plan_service(spec(), llama_8b(), nodes)
    assert again == fresh and (SHAPE_PLANS.misses, SERVICE_PLANS.misses) == made  # the whole plan from the memo
    SERVICE_PLANS.clear()
    assert plan_service(spec(), llama_8b(), nodes) == fresh and SHAPE_PLANS.misses == made[0]  # every shape's
    # The running plan is an input: the same plan again, though its shape is now the one the servers run on.
    assert plan_service(spec(), llama_8b(), nodes, current=fresh.model_dump(by_alias=True, mode="json")) == fresh
    forget_plans()
    assert plan_service(spec(), llama_8b(), nodes) == fresh


def test_any_changed_input_is_planned_again():
    nodes = [node("a", numa=2, cpu="64")]
    base = plan_service(spec(), llama_8b(), nodes)
    assert plan_service(spec(kvCacheGiB=3), llama_8b(), nodes).kv_cache_gi_b == 3 != base.kv_cache_gi_b
    assert plan_service(spec(), llama_8b(), [node("a", numa=2, cpu="32")]).cpu < base.cpu
    other_image = plan_service(spec(), llama_8b(), nodes, vllm_images={"amd64": "registry.example/vllm:1"})
    assert other_image.image == "registry.example/vllm:1" != base.image
    # What a node profile's equality leaves out is an input too: a price label gives the plan a cost.
    priced = node("a", numa=2, cpu="64", labels={PRICE_LABEL: "2.5"})
    assert priced == nodes[0] and base.predicted is not None and base.predicted.cost_per_million_tokens is None
    cost = plan_service(spec(), llama_8b(), [priced]).predicted
    assert cost is not None and cost.cost_per_million_tokens is not None
    # A profile made anew (a node event, a node fact refining it) keys as the one before it.
    made = SERVICE_PLANS.misses
    assert plan_service(spec(), llama_8b(), [dataclasses.replace(nodes[0])]) == base and SERVICE_PLANS.misses == made


def test_a_refused_plan_is_not_remembered():
    small, made = [node("a", numa=1, cpu="4", memory="4Gi")], SERVICE_PLANS.misses
    for _ in range(2):
        with pytest.raises(ModelTooLarge):
            plan_service(spec(), llama_8b(), small)
    assert not SERVICE_PLANS.values and SERVICE_PLANS.misses == made + 2
