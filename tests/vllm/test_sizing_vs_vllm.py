"""Sizing against vLLM itself. For a tiny random-weight model of each kind sizing tells apart (dense GQA, MoE,
hybrid sliding-window attention, MLA with the 576-wide latent, GPTQ int4, and the hybrids: Mamba2 with attention,
gated DeltaNet with attention, chunked local attention with experts, Nemotron-H's Mamba2, MLP and attention
layers, LFM2's short convolutions with attention), the rendered command is started and the
plan's figures are compared with what vLLM reports for the same model: weights within 5%, KV capacity exactly.
It starts with vLLM's compilation off (`--optimization-level 0`, in spec.extraArgs): neither figure depends on
it, and each start is shorter by the graph's compile (30-36 s against 55-69 s; tests/vllm/test_rendered_pod.py
starts the command as rendered):
- KV: vLLM's "CPU KV cache size: N tokens" (the sequences of the max model length its KV cache holds, times that
  length) for the plan's VLLM_CPU_KVCACHE_SPACE, equal to the plan's kvTokensPerRank;
- weights: the parameter bytes vLLM's loader holds once the checkpoint is loaded, before the CPU kernels repack
  them (tests/vllm/probe: vLLM CPU 0.32 logs no model-load memory), against the plan's weightsBytes sized both
  ways: the family formula over the inline config (as offline), and the checkpoint's safetensors headers."""

from __future__ import annotations

import io
import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed import machine
from testbed.tools import ROOT
from testbed.vllm_server import SIZES, render_service, server_for_container, this_machine

from cpullm.cli import main as cpullm

pytestmark = pytest.mark.vllm
PROBE = ROOT / "tests" / "vllm" / "probe"
TOLERANCE = 0.05
HAS_AVX512 = "avx512f" in machine.cpu_flags()
NO_COMPILE = ["--optimization-level", "0"]
# Each kind's context (max_model_len) and the KV layout its plan names.
CASES = {
    "dense": (1024, "2 full + 0 sliding layers, 2 KV heads x 64"),
    "moe": (1024, "2 full + 0 sliding layers, 2 KV heads x 64"),
    # 4096 tokens exceed the 256-token window plus the 2048 tokens in flight: the window bites.
    "hybrid": (4096, "2 full + 2 sliding (window 256) layers, 2 KV heads x 64"),
    "mla": (1024, "2 MLA layers, latent 576"),
    "gptq": (1024, "4 full + 0 sliding layers, 2 KV heads x 64"),
    # The hybrids: a state per sequence padded to a page, a chunk of 256 tokens that 4096 exceeds.
    "mamba2": (4096, "1 full + 3 mamba2 state layers, 2 KV heads x 64"),
    "gated_deltanet": (4096, "1 full + 3 gated_deltanet state layers, 2 KV heads x 64"),
    "chunked": (4096, "3 chunked (chunk 256) + 1 full layers, 2 KV heads x 64"),
    "nemotron_h": (4096, "1 full + 3 mamba2 state layers, 2 KV heads x 64"),
    "short_conv": (4096, "1 full + 3 short_conv state layers, 2 KV heads x 64"),
}
KINDS = tuple(CASES)


@pytest.fixture(scope="session")
def models(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out, script = tmp_path_factory.mktemp("sizing-models"), ROOT / "tests" / "vllm" / "make_models.py"

    def build(kind: str) -> None:
        subprocess.run([str(vllm_python), str(script), kind, str(out / kind)], check=True, capture_output=True)

    with ThreadPoolExecutor(2) as pool:  # each build is mostly one thread's work
        list(pool.map(build, KINDS))
    return {kind: out / kind for kind in KINDS}


def plan_from_headers(workdir: Path, model: Path, max_model_len: int) -> dict[str, Any]:
    """`cpullm plan --model-config DIR`: the service names the model directory, which holds config.json and the
    safetensors files whose headers size the weights."""
    service = {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "metadata": {"name": "headers"},
        "spec": {"model": {"name": f"/models/{model.name}"}, "kvCacheGiB": 1, "maxModelLen": max_model_len},
    }
    (workdir / "headers.yaml").write_text(yaml.safe_dump(service))
    (workdir / "nodes.yaml").write_text(yaml.safe_dump(this_machine(1)))
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = cpullm(
            [
                "plan",
                str(workdir / "headers.yaml"),
                "--nodes",
                str(workdir / "nodes.yaml"),
                "-o",
                "json",
                "--model-config",
                str(model),
            ]
        )
    assert code == 0
    plan: dict[str, Any] = json.loads(buffer.getvalue())
    return plan


def vllm_reports(log: str) -> tuple[int, int]:
    """(loaded parameter bytes, KV cache size in tokens) from the server's log."""
    loaded = re.search(r"cpullm-probe: loaded parameter bytes (\d+)", log)
    tokens = re.search(r"CPU KV cache size: ([\d,]+) tokens", log)
    assert loaded and tokens, "the probe's or vLLM's KV line is missing from the log"
    return int(loaded.group(1)), int(tokens.group(1).replace(",", ""))


def within(planned: int, served: int) -> bool:
    return abs(planned - served) <= TOLERANCE * served


@dataclass(frozen=True)
class Served:
    """A kind's plans (from its inline config and from its checkpoint's headers) and what its server reported."""

    plan: dict[str, Any]
    from_headers: dict[str, Any]
    loaded: int
    tokens: int
    startup_seconds: float


@pytest.fixture(scope="module")
def served(models, vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Served | Exception]:
    """Every kind this machine serves, rendered (one at a time: the CLI prints to this process's stdout), then
    started, asked for 4 tokens and stopped, two servers at a time (a start is mostly one thread's work: the ten
    took 6 minutes one by one); a kind's failure is its own test's."""
    kinds = [kind for kind in CASES if kind != "gptq" or HAS_AVX512]
    rendered = {}
    for kind in kinds:
        workdir = tmp_path_factory.mktemp(kind)
        max_model_len = CASES[kind][0]
        plan, container = render_service(workdir, models[kind], 1, maxModelLen=max_model_len, extraArgs=NO_COMPILE)
        rendered[kind] = (workdir, plan, container, plan_from_headers(workdir, models[kind], max_model_len))

    def serve(kind: str) -> Served | Exception:
        workdir, plan, container, from_headers = rendered[kind]
        server = server_for_container(
            container, workdir=workdir, python=vllm_python, model=models[kind], extra_env={"PYTHONPATH": str(PROBE)}
        )
        try:
            server.start(timeout=900)
            assert server.complete("The quick brown fox", max_tokens=4)["usage"]["completion_tokens"] == 4
        except Exception as failed:  # reported by this kind's test
            return failed
        finally:
            server.stop()
        loaded, tokens = vllm_reports(server.log.read_text(errors="replace"))
        return Served(plan, from_headers, loaded, tokens, server.measured.startup_seconds)

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(kinds, pool.map(serve, kinds), strict=True))


@pytest.mark.parametrize("kind", KINDS)
def test_plan_matches_what_vllm_serves(kind: str, served: dict[str, Served | Exception]):
    if kind == "gptq" and not HAS_AVX512:
        pytest.skip("no AVX-512 here: the planner refuses 4-bit layers (the test below checks vLLM agrees)")
    result = served[kind]
    if isinstance(result, Exception):
        raise result
    plan, from_headers = result.plan, result.from_headers
    assert plan["sizing"]["kvLayout"].startswith(CASES[kind][1])
    assert from_headers["sizing"]["weightsSource"].startswith("safetensors headers (1 file, ")
    SIZES[kind] = {
        "vLLM loaded bytes": result.loaded,
        "formula bytes": plan["weightsBytes"],
        "header bytes": from_headers["weightsBytes"],
        "vLLM KV tokens": result.tokens,
        "plan KV tokens": plan["kvTokensPerRank"],
        "start-up s": round(result.startup_seconds),
    }
    assert within(plan["weightsBytes"], result.loaded), SIZES[kind]
    assert within(from_headers["weightsBytes"], result.loaded), SIZES[kind]
    assert plan["kvTokensPerRank"] == result.tokens, SIZES[kind]  # vLLM's blocks, exactly
    if kind in (
        "dense",
        "moe",
        "mla",
        "gptq",
    ):  # every layer keeps every token: KV bytes per token is the KV space over its tokens
        assert within(plan["kvBytesPerToken"], 2**30 // result.tokens), SIZES[kind]


@pytest.mark.skipif(HAS_AVX512, reason="this machine has AVX-512: the GPTQ model is served above")
def test_4bit_layers_are_refused_where_vllm_has_no_kernel_for_them(
    models, vllm_python: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Without AVX-512, vLLM's x86 wheel loads its AVX2 kernel library, which has no 4-bit kernel: the planner
    refuses this machine for the GPTQ model, and vLLM, rendered for it anyway (the node claiming AVX-512), fails
    for want of that kernel."""
    with pytest.raises(RuntimeError, match="cpullm plan exited 1"):
        render_service(tmp_path, models["gptq"], 1, maxModelLen=1024)
    assert "lacks avx512f for gptq int4 group 128" in capsys.readouterr().err
    claimed = {"cpullm.io/isa.avx512f": "true"}
    # As rendered, compiling: vLLM's warm-up is where the missing kernel is called (with --optimization-level 0 it
    # starts; measured).
    _, container = render_service(tmp_path, models["gptq"], 1, node_labels=claimed, maxModelLen=1024)
    server = server_for_container(container, workdir=tmp_path, python=vllm_python, model=models["gptq"])
    try:
        with pytest.raises(RuntimeError, match="vLLM exited"):
            server.start(timeout=900)
    finally:
        server.stop()
    assert "has no attribute 'cpu_gemm_wna16'" in server.log.read_text(errors="replace")
