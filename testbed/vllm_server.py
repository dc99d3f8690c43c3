"""Runs a rendered vLLM container as a local process: its exact command, args and env, with only the model
path, the port and the pod's volume mount paths mapped to local ones, and measures it.

Used by the `vllm` tests, the real-node tests and the benches (the test bed: no suite imports another).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import yaml

from cpullm.cli import main as cpullm
from cpullm.core.topology import parse_quantity
from cpullm.vllm_support import REPORT_ENV
from testbed import machine
from testbed.cgroup import MemoryCgroup, Reading
from testbed.machine import drop_from_page_cache
from testbed.tools import ROOT, free_port, scrape

# The tests' tiny trained Llama, by its directory name (make_tiny_model).
TINY = "tiny-llama"
LAUNCHER_DIR = "opt-cpullm"  # where the launcher ConfigMap's files go, as the pod mounts them
REPORT_FILE = "termination-log"  # the server's report of its fixes, in its workdir

# What the tests measured, for the run's summary (conftest.py's pytest_terminal_summary).
SIZES: dict[str, dict[str, Any]] = {}  # test_sizing_vs_vllm: per kind, the figures side by side
MEMORY: dict[str, Measured] = {}  # test_rendered_pod: per case, the memory cgroup's readings
BINDINGS: dict[str, tuple[str, list[list[int]]]] = {}  # per case, the launcher's choice and the pinned CPUs
WAITING_PEAKS: dict[str, tuple[float, int, float]] = {}  # peak, scrapes, burst seconds


# Prompts for the benchmarks' single-stream and batch measurements.
PROMPTS = [
    "The quick brown fox",
    "Kubernetes schedules pods",
    "Each tensor parallel rank",
    "Once upon a time",
    "Large language models",
    "Memory placement",
    "Thread binding",
    "The lazy dog",
]


def make_tiny_model(python: Path, dest: Path) -> Path:
    """The tests' tiny Llama (tests/vllm/make_tiny_model.py, its weights trained: half a minute), built with the
    vLLM environment once per version of that script (kept under MODELS_CACHE) and copied to `dest`."""
    script = ROOT / "tests" / "vllm" / "make_tiny_model.py"
    built = MODELS_CACHE / f"tiny-{hashlib.sha256(script.read_bytes()).hexdigest()[:12]}"
    if not (built / "model.safetensors").exists():
        partial = built.with_name(built.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run([str(python), str(script), str(partial)], check=True)
        partial.rename(built)
    shutil.copytree(built, dest, dirs_exist_ok=True)
    return dest


def make_adapter(python: Path, model: Path, dest: Path, rank: int) -> Path:
    """A LoRA adapter of the Llama checkpoint `model` in PEFT's layout (tests/vllm/make_adapter.py: seeded random
    A and B of rank `rank` for every linear layer), written to `dest` with the vLLM environment."""
    script = ROOT / "tests" / "vllm" / "make_adapter.py"
    subprocess.run([str(python), str(script), str(model), str(dest), str(rank)], check=True)
    return dest


# Random-weight models of published sizes, built once and kept (bench/, the opt-in real-node start).
MODELS_CACHE = Path.home() / ".cache" / "cpullm-operator" / "models"


def built_model(python: Path, name: str) -> Path:
    """The model's directory under MODELS_CACHE, built on first use: `tiny` (make_tiny_model.py) or a random-weight
    checkpoint of one of make_sized_model.py's SIZES."""
    out = MODELS_CACHE / name
    if not (out / "config.json").exists():
        if name == "tiny":
            make_tiny_model(python, out)
        else:
            make = ROOT / "tests" / "vllm" / "make_sized_model.py"
            subprocess.run([str(python), str(make), name, str(out)], check=True)
    return out


def setup_vllm() -> tuple[Path, dict[str, Path]]:
    """The vLLM environment's python (the default image's version) and, per other version run here, the directory
    of its vLLM that a server puts first on PYTHONPATH (scripts/setup-vllm.sh makes both once)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-vllm.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    lines = out.stdout.strip().splitlines()
    overlays = {line.split()[1]: Path(line.split(maxsplit=2)[2]) for line in lines if line.startswith("overlay ")}
    return Path(lines[-1]), overlays


def vllm_python() -> Path:
    return setup_vllm()[0]


def this_machine(numa_nodes: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """This machine as a Node, from its real CPU flags, CPU count and memory; numa_nodes=2 describes it as
    vLLM sees it with VLLM_CPU_SIM_MULTI_NUMA=1 (the knob vLLM's own CPU CI uses for multi-rank runs on one
    NUMA node). `labels` are laid over its own (a test claiming a flag the machine lacks)."""
    labels = {"kubernetes.io/arch": machine.arch(), **machine.machine_labels(numa_nodes), **(labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "localhost", "labels": labels},
        "status": {"allocatable": {"cpu": str(machine.cpu_count()), "memory": str(machine.memory_bytes())}},
    }


def render_service(
    workdir: Path,
    model: Path,
    numa_nodes: int,
    /,
    node_labels: dict[str, str] | None = None,
    node_facts: Sequence[dict[str, Any]] = (),
    **spec: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plan, vLLM container) from `cpullm plan` and `cpullm render` for a CpuLLMService naming the local
    model directory `model` as /models/<its name> (config inline; a `model` entry in `spec` adds fields such as
    dtype), on this machine described with `numa_nodes` NUMA nodes (and `node_labels` over its own; `node_facts`,
    such as a NodePerformance of it, beside it in the nodes file). The rendered launcher ConfigMap's files are
    written to workdir/opt-cpullm as the pod's volume places them (see pod_mounts)."""
    model_fields = spec.pop("model", {})
    service = {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {
            "model": {
                "name": f"/models/{model.name}",
                "config": json.loads((model / "config.json").read_text()),
                **model_fields,
            },
            "kvCacheGiB": 1,
            "maxModelLen": 1024,
            "maxNumSeqs": 4,
            **spec,
        },
    }
    (workdir / "svc.yaml").write_text(yaml.safe_dump(service))
    (workdir / "nodes.yaml").write_text(yaml.safe_dump_all([this_machine(numa_nodes, node_labels), *node_facts]))
    outputs = []
    for command in ("plan", "render"):
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            output = ["-o", "json"] if command == "plan" else ["-o", "yaml"]
            code = cpullm([command, str(workdir / "svc.yaml"), "--nodes", str(workdir / "nodes.yaml"), *output])
        if code != 0:
            raise RuntimeError(f"cpullm {command} exited {code}")
        outputs.append(buffer.getvalue())
    objects = {obj["kind"]: obj for obj in yaml.safe_load_all(outputs[1])}
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    data, name = objects["ConfigMap"]["data"], objects["ConfigMap"]["metadata"]["name"]
    [volume] = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == name]
    for item in volume["configMap"]["items"]:
        path = workdir / LAUNCHER_DIR / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data[item["key"]])
    return json.loads(outputs[0]), pod["containers"][0]


def pod_mounts(workdir: Path, python: Path) -> dict[str, Path]:
    """The pod's paths as local ones: the model cache, the launcher ConfigMap, and the image's venv (/opt/venv,
    where LD_PRELOAD finds Intel OpenMP) as the vLLM environment made by scripts/setup-vllm.sh."""
    return {
        "/models": workdir / "models",
        "/opt/cpullm": workdir / LAUNCHER_DIR,
        "/opt/venv": python.parent.parent,
    }


def substitute(args: Sequence[str], model: str, port: int) -> list[str]:
    """The container's args with --model and --port replaced."""
    out = list(args)
    for flag, value in (("--model", model), ("--port", str(port))):
        out[out.index(flag) + 1] = value
    return out


def runtime_dirs(python: Path) -> list[Path]:
    """The vLLM environment and the Python installation it was made from (its pyvenv.cfg `home`): what the
    image's files are to a pod."""
    venv = python.parent.parent
    dirs = [venv]
    config = venv / "pyvenv.cfg"
    if config.exists():
        for line in config.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                dirs.append(Path(value.strip()).parent)
    return dirs


def process_rss(pids: Sequence[int]) -> list[tuple[str, int]]:
    """(name, RSS) of each process still alive."""
    parts = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            parts.append((proc.name(), proc.memory_info().rss))
    return parts


def process_anon(pids: Sequence[int]) -> list[tuple[str, int]]:
    """(name, anonymous resident bytes: /proc/PID/status RssAnon) of each process still alive: what a process
    holds of its own, its shared libraries' and files' pages left out (vLLM names its processes, e.g.
    VLLM::EngineCor, VLLM::Worker_TP)."""
    parts = []
    for pid in pids:
        with contextlib.suppress(OSError, psutil.Error):
            status = Path(f"/proc/{pid}/status").read_text()
            anon = next(
                (int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("RssAnon:")), None
            )
            if anon is not None:  # a zombie has no memory left to report
                parts.append((psutil.Process(pid).name(), anon))
    return parts


@dataclass
class Measured:
    """The server's memory as its cgroup accounts it (testbed/cgroup.py): the kernel's own peak of usage, the
    peak of working set (usage - inactive_file, what the kubelet evicts on) over the sampler's readings, the
    OOM kills the kernel counted, and, at the working-set peak, each process's RSS (secondary: RSS counts pages
    shared between processes once per process, so the parts may add up to more than the cgroup charges)."""

    startup_seconds: float = 0.0
    started_at: datetime | None = None  # wall clock (local time, as vLLM stamps its log) when it was spawned
    log: Path | None = None
    cgroup: str = ""
    limit_bytes: int | None = None  # the cgroup's memory limit (None: unlimited)
    peak_usage_bytes: int = 0  # kernel peak (v1 max_usage_in_bytes, v2 memory.peak), else the sampled one
    sampled_peak_usage_bytes: int = 0
    peak_working_set_bytes: int = 0
    oom_kills: int = 0
    samples: int = 0
    at_peak: Reading | None = None  # the cgroup's reading at the working-set peak, with its parts
    peak_breakdown: list[tuple[str, int]] = field(default_factory=list)
    peak_anon_bytes: int = 0  # the cgroup's anonymous memory at its sampled peak
    anon_breakdown: list[tuple[str, int]] = field(default_factory=list)  # each process's RssAnon then
    # Peaks per stretch of the server's life (LocalServer.mark): name -> (peak working set, peak anon).
    stretches: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class LocalServer:
    """A vLLM server process tree in a memory cgroup of its own (limited to `memory_limit` when given, as the
    kubelet limits a container), with a sampler thread recording its usage and working set. The cgroup is made
    at start and removed at stop; if it cannot be made, start raises CgroupUnavailable (no fallback).
    `cold` files and directories (the model, the vLLM environment) are dropped from the page cache before
    start: the kernel charges a cached page to the cgroup that first read it, so without this a server would be
    charged for its libraries and model only if no earlier server had read them; with it every start is charged
    as a pod starting on a node that has not yet read its image and model. The server finds its cgroup where a
    container finds its own (MemoryCgroup.seen_as_a_containers), so vLLM's memory checks read its limit and usage as
    they do in a pod."""

    command: list[str]
    env: dict[str, str]
    port: int
    log: Path
    memory_limit: int | None = None
    cold: Sequence[Path] = ()
    process: subprocess.Popen[bytes] | None = None
    cgroup: MemoryCgroup | None = None
    measured: Measured = field(default_factory=Measured)
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None
    _stretch: tuple[int, int] = (0, 0)  # peak working set and anon since the last mark

    def start(self, timeout: float = 600) -> None:
        for path in self.cold:
            drop_from_page_cache(path)
        self.cgroup = MemoryCgroup.create(f"cpullm-vllm-{os.getpid()}-{self.port}", self.memory_limit)
        self.measured.cgroup = f"v{self.cgroup.version} {self.cgroup.path}"
        self.measured.limit_bytes = self.cgroup.limit()
        started, self.measured.started_at = time.monotonic(), datetime.now()
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.cgroup.seen_as_a_containers(self.command),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=self.cgroup.join,  # in the cgroup before it execs: every byte of the tree is charged
            )
        self.measured.log = self.log
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        while time.monotonic() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as response:
                    if response.status == 200:
                        self.measured.startup_seconds = time.monotonic() - started
                        return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"vLLM did not answer /health within {timeout:.0f}s:\n{self.tail()}")

    def _sample(self) -> None:
        assert self.cgroup is not None
        while not self._stop.is_set():
            try:
                reading = self.cgroup.reading()
            except FileNotFoundError:  # removed at stop
                return
            self.measured.sampled_peak_usage_bytes = max(self.measured.sampled_peak_usage_bytes, reading.usage)
            if reading.working_set > self.measured.peak_working_set_bytes:
                self.measured.peak_working_set_bytes, self.measured.at_peak = reading.working_set, reading
                self.measured.peak_breakdown = process_rss(self.cgroup.pids())
            if reading.anon > self.measured.peak_anon_bytes:
                self.measured.peak_anon_bytes = reading.anon
                self.measured.anon_breakdown = process_anon(self.cgroup.pids())
            self._stretch = (max(self._stretch[0], reading.working_set), max(self._stretch[1], reading.anon))
            self.measured.samples += 1
            time.sleep(0.2)

    def mark(self, stretch: str) -> None:
        """Close a stretch of the server's life (its start, a request mix): its peaks go to measured.stretches
        and the next stretch starts from nothing."""
        self.measured.stretches[stretch], self._stretch = self._stretch, (0, 0)

    def _final_reading(self) -> None:
        """The kernel's peak and OOM count, read before the cgroup goes away."""
        assert self.cgroup is not None
        kernel_peak = self.cgroup.kernel_peak()
        self.measured.peak_usage_bytes = (
            kernel_peak if kernel_peak is not None else self.measured.sampled_peak_usage_bytes
        )
        self.measured.oom_kills = self.cgroup.oom_kills()

    def complete(
        self, prompt: str | list[str] | list[int], max_tokens: int, timeout: float = 600, model: str | None = None
    ) -> dict[str, Any]:
        """A greedy completion from the served model, or from `model` (an adapter's name)."""
        body = {
            "model": model or self.served_model(),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "skip_special_tokens": False,  # a random model emits special tokens too
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            result: dict[str, Any] = json.loads(response.read())
        return result

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus metrics: one value per series (name and labels as printed)."""
        return scrape(f"http://127.0.0.1:{self.port}/metrics")

    def models(self) -> list[str]:
        """What /v1/models lists: the model first, then its adapters."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=10) as response:
            return [str(entry["id"]) for entry in json.loads(response.read())["data"]]

    def served_model(self) -> str:
        return self.models()[0]

    def version(self) -> str:
        """The vLLM version the server says it is (its /version route)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/version", timeout=10) as response:
            return str(json.loads(response.read())["version"])

    def stop(self) -> None:
        self._stop.set()
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout=30)
        if self._sampler:
            self._sampler.join(timeout=5)
        if self.cgroup:
            self._final_reading()
            self.cgroup.remove()  # kills whatever left the process group but not the cgroup

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


def server_for_container(
    container: dict[str, Any],
    *,
    workdir: Path,
    python: Path,
    model: Path,
    log_name: str = "vllm.log",
    taskset: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
) -> LocalServer:
    """The rendered container (rendered into `workdir` by render_service) as a local command on a free port,
    logging to `workdir/log_name`: `python3` resolves to the vLLM environment (it is first on PATH), the
    command and env values are taken as rendered with the pod's mount paths mapped to local directories
    (pod_mounts). `taskset` (e.g. ["taskset", "-c", "1"]) starts it inside a smaller cpuset, as a pod's;
    `extra_env` adds variables the pod does not have (a test probe's PYTHONPATH). Its
    memory cgroup is limited to the container's memory limit, as the kubelet limits the container's, and the
    model's and the runtime's files are dropped from the page cache first (see LocalServer)."""

    mounts = pod_mounts(workdir, python)
    port = free_port()

    def local(value: str) -> str:
        for pod_path, local_path in mounts.items():
            value = value.replace(pod_path, str(local_path))
        return value

    env = {"PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    env.update({entry["name"]: local(entry["value"]) for entry in container["env"] if "value" in entry})
    # The server's report of its fixes, which a pod writes to its termination message (vllm_support.REPORT_PATH).
    env[REPORT_ENV] = str(workdir / REPORT_FILE)
    env.update(extra_env or {})
    # Every pod path in the args too (an adapter's source under /models), before --model is the local model's.
    command = [*map(local, container["command"]), *substitute(list(map(local, container["args"])), str(model), port)]
    limit = container["resources"]["limits"]["memory"]
    return LocalServer(
        command=[*taskset, *command],
        env=env,
        port=port,
        log=workdir / log_name,
        memory_limit=int(parse_quantity(limit)),
        cold=[model, *runtime_dirs(python)],
    )
