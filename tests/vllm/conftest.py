"""Fixtures of the real-vLLM tests: the vLLM environment (scripts/setup-vllm.sh), a tiny local model and, for
the opt-in CPULLM_VLLM_LARGE=1 cases, a random-weight model of Qwen2.5-0.5B's size."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from testbed.vllm_server import BINDINGS, MEMORY, SIZES, WAITING_PEAKS, make_tiny_model, setup_vllm


@pytest.fixture(scope="session")
def vllm_environment() -> tuple[Path, dict[str, Path]]:
    return setup_vllm()


@pytest.fixture(scope="session")
def vllm_python(vllm_environment: tuple[Path, dict[str, Path]]) -> Path:
    return vllm_environment[0]


@pytest.fixture(scope="session")
def vllm_overlays(vllm_environment: tuple[Path, dict[str, Path]]) -> dict[str, Path]:
    """Each other vLLM version run here: the directory a server puts first on PYTHONPATH to run it."""
    return vllm_environment[1]


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(vllm_python, tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def qwen_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("CPULLM_VLLM_LARGE") != "1":
        pytest.skip("the ~0.5B-parameter model costs minutes per start here: set CPULLM_VLLM_LARGE=1 to run it")
    out = tmp_path_factory.mktemp("models") / "qwen2.5-0.5b-random"
    make = Path(__file__).parent / "make_sized_model.py"
    subprocess.run([str(vllm_python), str(make), "qwen2.5-0.5b", str(out)], check=True)
    return out


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SIZES:
        terminalreporter.section("sizing against vLLM: weights (bytes) and KV cache capacity (tokens), side by side")
        columns = list(next(iter(SIZES.values())))
        terminalreporter.write_line("kind     " + "".join(f"{c:>20}" for c in columns))
        for kind, row in SIZES.items():
            terminalreporter.write_line(f"{kind:<9}" + "".join(f"{row[c]:>20,}" for c in columns))
    if MEMORY:
        terminalreporter.section("the vLLM server's memory cgroup: peaks against its limit (the planned one)")
        for case, m in sorted(MEMORY.items()):
            limit = m.limit_bytes or 0
            terminalreporter.write_line(
                f"{case}: peak usage {m.peak_usage_bytes / 2**30:.3f} GiB ({m.peak_usage_bytes / limit:.3f}), "
                f"peak working set {m.peak_working_set_bytes / 2**30:.3f} GiB ({m.peak_working_set_bytes / limit:.3f})"
                f" of the {limit / 2**30:.3f} GiB limit; OOM kills {m.oom_kills}; {m.samples} samples; "
                f"start-up {m.startup_seconds:.0f} s"
            )
            if m.at_peak:
                r = m.at_peak
                terminalreporter.write_line(
                    f"  at the working-set peak (GiB): anon {r.anon / 2**30:.3f}, shmem {r.shmem / 2**30:.3f}, "
                    f"active_file {r.active_file / 2**30:.3f}, inactive_file {r.inactive_file / 2**30:.3f}, "
                    f"other {r.other / 2**30:.3f}"
                )
            parts = ", ".join(f"{name} {size / 2**30:.2f}" for name, size in m.peak_breakdown)
            terminalreporter.write_line(f"  RSS per process at the peak (GiB, shared pages repeat): {parts}")
    if BINDINGS:
        terminalreporter.section("in-pod launcher: threadsBind chosen / CPUs the server's threads were pinned to")
        for case, (bind, pinned) in sorted(BINDINGS.items()):
            terminalreporter.write_line(f"{case}: threadsBind={bind}; pinned CPUs per process: {pinned}")
    if WAITING_PEAKS:
        terminalreporter.section("vllm:num_requests_waiting, peak during a burst of 12 requests (maxNumSeqs 4)")
        for case, (peak, scrapes, seconds) in sorted(WAITING_PEAKS.items()):
            terminalreporter.write_line(f"{case}: {peak:g} (highest of {scrapes} scrapes in a {seconds:.1f} s burst)")
