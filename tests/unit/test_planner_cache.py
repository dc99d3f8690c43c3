"""The planner's memo of plans per shape (core/planner.py SHAPE_PLANS): what it returns is what planning afresh
makes, and a changed input is planned again."""

from __future__ import annotations

from cpullm.core.planner import SHAPE_PLANS, plan_service

from .builders import llama_8b, node, spec


def test_a_plan_made_again_from_the_memo_equals_one_made_afresh():
    nodes = [node("a", numa=2, cpu="64"), node("b", numa=1, cpu="32"), node("c", numa=2, cpu="64")]
    fresh = plan_service(spec(), llama_8b(), nodes)
    made = SHAPE_PLANS.misses
    again = plan_service(spec(), llama_8b(), nodes)
    assert again == fresh and SHAPE_PLANS.misses == made  # every shape from the memo
    # The running plan is an input: the same plan again, though its shape is now the one the servers run on.
    assert plan_service(spec(), llama_8b(), nodes, current=fresh.model_dump(by_alias=True, mode="json")) == fresh
    SHAPE_PLANS.clear()
    assert plan_service(spec(), llama_8b(), nodes) == fresh


def test_any_changed_input_is_planned_again():
    nodes = [node("a", numa=2, cpu="64")]
    base = plan_service(spec(), llama_8b(), nodes)
    assert plan_service(spec(kvCacheGiB=3), llama_8b(), nodes).kv_cache_gi_b == 3 != base.kv_cache_gi_b
    assert plan_service(spec(), llama_8b(), [node("a", numa=2, cpu="32")]).cpu < base.cpu
    other_image = plan_service(spec(), llama_8b(), nodes, vllm_images={"amd64": "registry.example/vllm:1"})
    assert other_image.image == "registry.example/vllm:1" != base.image
