"""The operator's Deployment serving real vLLM (the local stand-in vLLM image, testbed/images.py) with the tests' tiny
random-weight model: shared by the real-node tests (e2e/test_node.py) and the kind tests (e2e/test_in_kind.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testbed import machine
from testbed.tools import Kubectl
from testbed.vllm_server import TINY

from cpullm import launcher, vllm_support
from cpullm.core.constants import MODEL_CACHE_MOUNT

CAP_SYS_NICE = 23


def model_volume(namespace: str, models_on_node: str) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume of the node's models directory and its claim, bound to each other by name."""
    pv, claim = f"models-{namespace}", "models"
    size = {"storage": "1Gi"}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": size,
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "manual",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": models_on_node, "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "manual",
                "resources": {"requests": size},
                "volumeName": pv,
            },
        },
    ]


def tiny_served(
    namespace: str, models: Path, node_selector: dict[str, str], model: str = TINY, **spec: Any
) -> dict[str, Any]:
    """The service `tiny`: a model of the local models directory (the tiny one unless `model` names another) on one
    real CPU, its config read from there."""
    return {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "metadata": {"name": "tiny", "namespace": namespace},
        "spec": {
            "model": {
                "name": f"{MODEL_CACHE_MOUNT}/{model}",
                "config": json.loads((models / model / "config.json").read_text()),
            },
            "kvCacheGiB": 1,
            "maxModelLen": 1024,
            "maxNumSeqs": 4,
            "cpu": {"cpusPerRank": 1},
            "nodeSelector": node_selector,
            "modelCache": {"persistentVolumeClaim": {"claimName": "models"}},
            **spec,
        },
    }


def server_pods(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    pods = kubectl.get("pods", namespace=namespace, **{"cpullm.io/service": "tiny"})
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


IN_CONTAINER_SCRIPT = r"""
grep -E '^(Cpus_allowed_list|Seccomp|CapEff):' /proc/1/status
echo "uid: $(id -u)"
python3 - <<'PY'
# vLLM's NUMA calls under the pod's seccomp profile: glibc wraps none of them, so by number.
import ctypes, mmap, os
numbers = {"x86_64": (239, 238, 237, 256, 279), "aarch64": (236, 237, 235, 238, 239)}[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
mode, mask, status = ctypes.c_int(), ctypes.c_ulong(1), ctypes.c_int()
page = mmap.mmap(-1, mmap.PAGESIZE)
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
calls = {
    "get_mempolicy": (numbers[0], ctypes.byref(mode), None, 0, None, 0),
    "set_mempolicy": (numbers[1], 0, None, 0),
    "mbind": (numbers[2], ctypes.c_void_p(address), mmap.PAGESIZE, 0, None, 0, 0),
    "migrate_pages": (numbers[3], 0, 64, ctypes.byref(mask), ctypes.byref(mask)),
    # The page's node, asked of the process itself (no nodes given: a query, nothing moves).
    "move_pages": (numbers[4], 0, 1, ctypes.byref(ctypes.c_void_p(address)), None, ctypes.byref(status), 0),
}
for name, args in calls.items():
    result = libc.syscall(*args)
    print(f"numa_{name}: {'ok' if result >= 0 else os.strerror(ctypes.get_errno())}")
PY
for t in /proc/[0-9]*/task/[0-9]*; do echo "thread: $(grep Cpus_allowed_list $t/status | cut -f2)"; done
echo "shm_kib: $(df -k /dev/shm | awk 'NR == 2 {print $2}')"
if [ -e /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
  cd /sys/fs/cgroup/memory
  echo "limit: $(cat memory.limit_in_bytes)"; echo "peak: $(cat memory.max_usage_in_bytes)"
  echo "usage: $(cat memory.usage_in_bytes)"
  echo "inactive_file: $(awk '$1 == "total_inactive_file" {print $2}' memory.stat)"
  echo "oom_kills: $(awk '$1 == "oom_kill" {print $2}' memory.oom_control)"
else
  cd /sys/fs/cgroup
  echo "limit: $(cat memory.max)"; echo "peak: $(cat memory.peak)"; echo "usage: $(cat memory.current)"
  echo "inactive_file: $(awk '$1 == "inactive_file" {print $2}' memory.stat)"
  echo "oom_kills: $(awk '$1 == "oom_kill" {print $2}' memory.events)"
fi
"""


def in_container(kubectl: Kubectl, namespace: str, pod: str) -> dict[str, Any]:
    """What the server's container sees: its CPUs and every thread's, seccomp, capabilities, /dev/shm and its
    memory cgroup (v1 or v2)."""
    out = kubectl.run("exec", pod, "-n", namespace, "-c", "vllm", "--", "sh", "-c", IN_CONTAINER_SCRIPT).stdout
    seen: dict[str, Any] = {"threads": []}
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key == "thread":
            seen["threads"].append(value.strip())
        elif value:
            seen[key] = value.strip()
    return seen


def assert_as_planned(seen: dict[str, Any], plan: dict[str, Any]) -> None:
    """What in_container saw matches the plan: as many CPUs as planned, not the reserved CPU 0, holding every
    thread; the runtime's seccomp filter and SYS_NICE as the only capability; /dev/shm and the memory limit as
    planned; no OOM kill."""
    allowed = set(launcher.parse_cpu_list(seen["Cpus_allowed_list"]))
    assert len(allowed) == plan["cpu"] and 0 not in allowed, seen
    assert seen["threads"] and all(set(launcher.parse_cpu_list(t)) <= allowed for t in seen["threads"]), seen
    assert seen["Seccomp"] == "2" and int(seen["CapEff"], 16) == 1 << CAP_SYS_NICE, seen  # 2: filtered
    # The calls vLLM's NUMA binding makes pass the runtime's default profile with SYS_NICE (migrate_pages, which
    # vLLM's CPU worker does not need to serve, is recorded by the caller, not asserted).
    assert all(seen[f"numa_{call}"] == "ok" for call in ("get_mempolicy", "set_mempolicy", "mbind")), seen
    assert int(seen["shm_kib"]) * 1024 == plan["shmBytes"], seen
    assert int(seen["limit"]) == plan["memoryLimitBytes"] and int(seen["oom_kills"] or 0) == 0, seen


def assert_fixes_reported_loaded(kubectl: Kubectl, namespace: str, pod: str, plan: dict[str, Any]) -> None:
    """The server's own report of its fixes, in its termination message as the kubelet will keep it when the container
    ends (vllm_support.REPORT_PATH, written by the server's user): every fix the plan counts on loaded."""
    out = kubectl.run("exec", pod, "-n", namespace, "-c", "vllm", "--", "cat", vllm_support.REPORT_PATH).stdout
    outcomes = vllm_support.read_report(out)
    assert plan["fixesCredited"] and {fix: outcomes.get(fix) for fix in plan["fixesCredited"]} == dict.fromkeys(
        plan["fixesCredited"], vllm_support.LOADED
    ), out
    # The AMX tile permission, by this machine's flags (the node's labels are read from them): asked for where the
    # CPU has AMX tiles, and said not to be for this CPU elsewhere.
    amx = vllm_support.LOADED if "amx_tile" in machine.cpu_flags() else vllm_support.NOT_THIS_CPU
    assert outcomes.get(vllm_support.AMX_TILE_PERMISSION) == amx, out


def completion_request(tokens: int, model: str) -> dict[str, Any]:
    """A completion of exactly `tokens` tokens (ignore_eos) from a model of the model cache."""
    return {
        "model": f"{MODEL_CACHE_MOUNT}/{model}",
        "prompt": "The quick brown fox",
        "max_tokens": tokens,
        "ignore_eos": True,
    }
