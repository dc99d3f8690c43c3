"""A LoRA adapter on real vLLM: the tests' trained tiny model with an adapter of it (tests/vllm/make_adapter.py), its
container rendered with spec.adapters, serves both under a memory cgroup at the plan's limit: /v1/models lists the
adapter under its name, a request naming it is answered by the adapted model (another text than the base model's),
and the base model's own text is the same as a server without adapters gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from testbed.vllm_server import make_adapter, render_service, server_for_container

pytestmark = pytest.mark.vllm

PROMPTS = ["The capital of France is", "Once upon a time", "Kubernetes schedules pods onto"]
RANK = 8
END_OF_DOCUMENT = "</s>"  # the trained tiny model's (tests/vllm/make_tiny_model.py)


def test_an_adapter_is_served_under_its_name_within_the_plans_memory(vllm_python: Path, tiny_model: Path, tmp_path):
    adapter = {"name": "tuned", "source": "/models/adapters/tuned", "rank": RANK}
    plans, texts, models = {}, {}, {}
    for case, spec in (("plain", {}), ("adapted", {"adapters": [adapter]})):
        workdir = tmp_path / case
        workdir.mkdir()
        if spec:
            make_adapter(vllm_python, tiny_model, workdir / "models" / "adapters" / "tuned", RANK)  # the pod's /models
        plan, container = render_service(workdir, tiny_model, 1, **spec)
        plans[case] = plan
        server = server_for_container(container, workdir=workdir, python=vllm_python, model=tiny_model)
        try:
            server.start()
            models[case] = server.models()
            names = models[case] if spec else models[case][:1]
            texts[case] = {
                name: [server.complete(p, max_tokens=16, model=name)["choices"][0]["text"] for p in PROMPTS]
                for name in names
            }
        finally:
            server.stop()
        measured = server.measured
        assert measured.oom_kills == 0, f"{case}: the kernel OOM-killed {measured.oom_kills} process(es)"
        assert measured.peak_working_set_bytes < plan["memoryLimitBytes"], case

    assert plans["plain"]["adapterBytes"] == 0 < plans["adapted"]["adapterBytes"]
    assert plans["adapted"]["memoryLimitBytes"] > plans["plain"]["memoryLimitBytes"]
    base = models["plain"][0]
    assert models["adapted"] == [base, "tuned"]
    # The base model's text, unchanged by LoRA being on, to the end of its first document: after it the tiny model
    # starts another from a nearly flat distribution, and the order of the floating-point sums (a compiled graph
    # without LoRA, eager ops with it) picks among near-ties; on Zen 4 one of three texts parted there.
    assert [first_document(t) for t in texts["adapted"][base]] == [first_document(t) for t in texts["plain"][base]]
    assert texts["adapted"]["tuned"] != texts["adapted"][base]  # the adapter changes what the model says


def first_document(text: str) -> str:
    return text.split(END_OF_DOCUMENT, 1)[0]
