"""vLLM's AOT compile cache as the operator renders it for a model cache kept across pods (Plan.aotCompileCache,
the launcher's fix 4 in cpullm/vllm_fixes.py) against real vLLM on the tiny model: the first start saves the
compiled model in the model cache, a second start on the same cache loads it instead of compiling, and the loaded
model answers requests of other sizes than the warm-up's exactly as the first start, which compiled it. Turning the
fix off turns the cache off in the plan (no third start: the first start already is a server that compiles)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from testbed.vllm_server import render_service, server_for_container

from cpullm import vllm_fixes

pytestmark = pytest.mark.vllm
# A model cache kept across pods, where the plan turns the AOT cache on (the harness maps /models to a local
# directory whatever the volume).
CLAIM = {"persistentVolumeClaim": {"claimName": "models"}}
SAVED = "saved AOT compiled function"
LOADED_BY_VLLM = "Directly load AOT compilation"
# Prompts of other sizes than the warm-up step's, one at a time and as a batch: the compiled model is traced for a
# range of sizes, and a load that kept only the warm-up's would answer these differently or fail.
PROMPTS: list[str | list[str]] = [
    "Hi",
    "Each tensor parallel rank binds to the CPUs of one NUMA node, and the KV cache of each rank",
    ["The quick brown fox", "Kubernetes schedules pods onto nodes that have room for their requests", "CPU"],
]


def answers(container: dict[str, Any], workdir: Path, log_name: str, vllm_python: Path, model: Path) -> list[Any]:
    """The server's greedy completions of PROMPTS, from one start of the rendered container in `workdir`."""
    server = server_for_container(container, workdir=workdir, python=vllm_python, model=model, log_name=log_name)
    try:
        server.start()
        return [[c["text"] for c in server.complete(prompt, max_tokens=8)["choices"]] for prompt in PROMPTS]
    finally:
        server.stop()


def test_a_second_start_loads_the_compiled_model_and_answers_as_the_first(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
):
    plan, container = render_service(tmp_path, tiny_model, 1, modelCache=CLAIM)
    assert plan["aotCompileCache"]
    assert {"name": "VLLM_USE_AOT_COMPILE", "value": "1"} in container["env"]
    first = answers(container, tmp_path, "first.log", vllm_python, tiny_model)
    second = answers(container, tmp_path, "second.log", vllm_python, tiny_model)
    first_log, second_log = ((tmp_path / name).read_text(errors="replace") for name in ("first.log", "second.log"))
    assert SAVED in first_log and LOADED_BY_VLLM not in first_log
    assert f"{vllm_fixes.LOG_PREFIX} {vllm_fixes.AOT_LOADED}" in second_log and LOADED_BY_VLLM in second_log
    assert SAVED not in second_log  # nothing compiled again
    assert second == first

    off = tmp_path / "off"
    off.mkdir()
    turned_off = [{"name": vllm_fixes.OFF_ENV, "value": vllm_fixes.aot_cache_loads.__name__}]
    plan_off, container_off = render_service(off, tiny_model, 1, modelCache=CLAIM, env=turned_off)
    assert not plan_off["aotCompileCache"]
    assert {"name": "VLLM_USE_AOT_COMPILE", "value": "0"} in container_off["env"]
