"""This machine as a Node object, and its measured performance: what `cpullm probe` prints, so that `cpullm plan
--nodes` plans for the machine it ran on (the labels the operator reads: its arch, NUMA count, ISA flags and SMT;
its CPUs and memory as allocatable). The probe itself (cpullm/perf_probe.py) runs in the vLLM environment, whose
torch and vLLM kernels it measures."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

from cpullm.api.performance import KIND
from cpullm.core.topology import ARCH_LABEL, ISA_LABEL_PREFIX, NFD_SMT, NUMA_NODES_LABEL

PROBE_SCRIPT = "perf_probe.py"
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
# The flags worth a label: those a plan or a caution reads (core/), and those users require most.
LABELLED_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "avx_ne_convert",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "bf16",
    "i8mm",
    "sve",
)


class ProbeError(Exception):
    """The probe could not run here; the message says what to do."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    for line in cpuinfo.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def numa_node_count(root: Path = Path("/sys/devices/system/node")) -> int:
    return max(1, len(list(root.glob("node[0-9]*"))))


def smt_active(path: Path = Path("/sys/devices/system/cpu/smt/active")) -> bool | None:
    try:
        return path.read_text().strip() == "1"
    except OSError:
        return None


def memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def this_node(name: str) -> dict[str, Any]:
    """This machine as the operator reads a Node."""
    labels = {ARCH_LABEL: ARCHES.get(platform.machine(), platform.machine()), NUMA_NODES_LABEL: str(numa_node_count())}
    flags = cpu_flags()
    labels.update({f"{ISA_LABEL_PREFIX}{flag}": "true" for flag in LABELLED_FLAGS if flag in flags})
    smt = smt_active()
    if smt is not None:
        labels[NFD_SMT] = str(smt).lower()
    allocatable = {"cpu": str(len(os.sched_getaffinity(0))), "memory": str(memory_bytes())}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": allocatable},
    }


def probe_script() -> str:
    """The probe's source: a script of the standard library and what the vLLM image has (torch, vLLM), nothing of
    cpullm's, so any python with those runs it (the chart's probe Job saves it for the vLLM image's python)."""
    return resources.files("cpullm").joinpath(PROBE_SCRIPT).read_text()


def probe(python: str, name: str, seconds_per_point: float) -> dict[str, Any]:
    """The NodePerformance of this machine, measured with `python` (one with torch: the vLLM environment's)."""
    script = resources.files("cpullm").joinpath(PROBE_SCRIPT)
    has_torch = subprocess.run([python, "-c", "import torch"], capture_output=True, check=False)
    if has_torch.returncode != 0:
        raise ProbeError(
            f"{python} has no torch: name the vLLM environment's python with --python (scripts/setup-vllm.sh makes "
            "one), or run the probe in the vLLM image (the chart's probe Job)"
        )
    command = [python, str(script), "--node-name", name, "--seconds-per-point", str(seconds_per_point)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ProbeError(f"the probe failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result.get("kind") != KIND:
        raise ProbeError(f"the probe printed a {result.get('kind')}, not a {KIND}")
    return result
