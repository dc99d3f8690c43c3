"""vLLM's CPU attention kernel and AMX tiles. vLLM 0.31 and 0.32 run AMX tile instructions in their attention kernel
without asking Linux for the AMX state, and Linux raises SIGILL for them in a process that has not asked; oneDNN asks
for itself, so a server lives only if a oneDNN matmul happened to choose AMX first. The pod's fix
(vllm_fixes.amx_tile_permission) asks in every process that imports vLLM. Here the kernel runs alone in a fresh
process (attention_probe.py), with the pod's site directory on PYTHONPATH as the launcher puts it, and without.

What the machine's flags choose: where the CPU has `amx_tile`, vLLM picks its AMX kernel, the fix must report
`loaded` and the process without the fix must die by SIGILL (when it no longer does, vLLM asks by itself: give the
fix an `until` version); elsewhere the fix reports `not-this-cpu` and both processes run."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from testbed import machine

from cpullm import vllm_support
from cpullm.core.children.launcher import SOURCES
from cpullm.core.constants import SITECUSTOMIZE_FILE

pytestmark = pytest.mark.vllm
PROBE = Path(__file__).with_name("attention_probe.py")
HAS_AMX = "amx_tile" in machine.cpu_flags()


def run_probe(python: Path, pythonpath: list[Path], report: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": os.pathsep.join(map(str, pythonpath)),
        "PYTHONFAULTHANDLER": "1",
        vllm_support.REPORT_ENV: str(report),
    }
    return subprocess.run([str(python), str(PROBE)], env=env, capture_output=True, text=True, timeout=300)


RUN_HERE = [version for version, release in vllm_support.RELEASES.items() if release.run_here]


@pytest.mark.parametrize("version", RUN_HERE)
def test_the_attention_kernel_runs_in_a_process_with_the_pods_fixes_and_dies_without_them_on_amx(
    version: str, vllm_python: Path, vllm_overlays: dict[str, Path], tmp_path: Path
):
    overlay = [vllm_overlays[version]] if version in vllm_overlays else []
    site = tmp_path / "site"
    site.mkdir()
    (site / SITECUSTOMIZE_FILE).write_text(SOURCES[SITECUSTOMIZE_FILE])  # as the launcher ConfigMap carries it

    fixed = run_probe(vllm_python, [site, *overlay], tmp_path / "report")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert (fixed.stdout.splitlines()[0] == "isa amx") is HAS_AMX  # vLLM's choice of kernel on this CPU
    assert "attention ok" in fixed.stdout
    outcome = vllm_support.read_report((tmp_path / "report").read_text())[vllm_support.AMX_TILE_PERMISSION]
    assert outcome == (vllm_support.LOADED if HAS_AMX else vllm_support.NOT_THIS_CPU)

    plain = run_probe(vllm_python, overlay, tmp_path / "no-report")
    if HAS_AMX:
        assert plain.returncode == -signal.SIGILL, (
            f"vLLM {version}'s AMX attention ran without the permission (exit {plain.returncode}): if vLLM now asks "
            "for it itself, give amx_tile_permission an `until` version in vllm_support.FIX_VERSIONS"
        )
        # faulthandler names the signal in a second write that an OpenMP thread's death can cut off; the exit
        # status above is the evidence, this says the interpreter saw the fault rather than being killed from outside.
        assert "Fatal Python error" in plain.stderr
    else:
        assert plain.returncode == 0 and "attention ok" in plain.stdout, plain.stderr[-3000:]
