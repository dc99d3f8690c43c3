"""Fixtures of the real-vLLM tests: the vLLM environment (scripts/setup-vllm.sh) and a tiny local model."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.vllm.harness import vllm_python as setup_vllm_python

RATIOS: dict[str, tuple[int, int]] = {}
BREAKDOWNS: dict[str, list[tuple[str, int]]] = {}
BINDINGS: dict[str, tuple[str, list[list[int]]]] = {}
WAITING_PEAKS: dict[str, float] = {}


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return setup_vllm_python()


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    subprocess.run([str(vllm_python), str(Path(__file__).parent / "make_tiny_model.py"), str(out)], check=True)
    return out


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if RATIOS:
        terminalreporter.section("peak RSS of the vLLM process tree / planned container memory limit")
        for case, (peak, limit) in sorted(RATIOS.items()):
            terminalreporter.write_line(
                f"{case}: peak {peak / 2**30:.2f} GiB / limit {limit / 2**30:.2f} GiB = {peak / limit:.3f}"
            )
            parts = ", ".join(f"{name} {size / 2**30:.2f}" for name, size in BREAKDOWNS.get(case, []))
            terminalreporter.write_line(f"  at the peak (GiB): {parts}")
    if BINDINGS:
        terminalreporter.section("in-pod launcher: threadsBind chosen / CPUs the server's threads were pinned to")
        for case, (bind, pinned) in sorted(BINDINGS.items()):
            terminalreporter.write_line(f"{case}: threadsBind={bind}; pinned CPUs per process: {pinned}")
    if WAITING_PEAKS:
        terminalreporter.section("vllm:num_requests_waiting, peak during a burst of 12 requests (maxNumSeqs 4)")
        for case, peak in sorted(WAITING_PEAKS.items()):
            terminalreporter.write_line(f"{case}: {peak:g}")
