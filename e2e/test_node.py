"""A real node (pytest marker `node`; root; deselected by default): the kubelet with containerd, runc, the CNI
bridge and kube-proxy joined to a local control plane of its own (cluster cpullm-node, where KWOK manages only
annotated fake nodes), testbed/realnode.py. The operator runs there as users run it: its image built from the
Dockerfile, installed with the Helm chart. Run: python -m pytest e2e/test_node.py -m node (first run: builds the
kubelet, kube-proxy and the images, scripts/setup-node.sh and scripts/build-images.sh). CPULLM_NODE_MODEL=NAME
(one of tests/vllm/make_sized_model.py's SIZES, e.g. qwen2.5-0.5b) serves that random-weight model in the test of
the two starts instead of the tiny one (opt-in: minutes more per start)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from testbed.cgroup import container_cgroup, hold_cpu_to, hold_new_containers_to_usage
from testbed.cluster import LocalCluster, tool_dirs
from testbed.images import CACHE, build_debian, build_operator, build_pause, vllm_image_ref
from testbed.machine import arch, drop_from_page_cache
from testbed.operator import InClusterOperator, not_ready_for
from testbed.prometheus import Prometheus, Target, alert_queries, dashboard_queries
from testbed.realnode import REAL_NODE_SELECTOR, RealNode
from testbed.registry import local_registry, push_index
from testbed.tools import ROOT, Kubectl, eventually
from testbed.vllm_log import StartSplit, start_split
from testbed.vllm_server import built_model, make_tiny_model, vllm_python

from cpullm import launcher, vllm_fixes
from cpullm.core.constants import SERVER_NON_ROOT_UID
from e2e.serving import (
    CAP_SYS_NICE,
    TINY,
    assert_as_planned,
    assert_fixes_reported_loaded,
    completion_request,
    in_container,
    model_volume,
    server_pods,
    tiny_served,
)
from e2e.support import CHART, Helm, conditions, probe_measured, probe_values, ready

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(os.geteuid() != 0, reason="a real node needs root"),
    pytest.mark.skipif(bool(os.environ.get("CPULLM_E2E_KUBECONFIG")), reason="joins a local control plane only"),
]
NODE_CLUSTER_NAME = "cpullm-node"
STARTED_MODEL = os.environ.get("CPULLM_NODE_MODEL", TINY)
SHM = 64 * 1024 * 1024
PERFORMANCE_CHECK_SECONDS = 15
MEMORY = 300 * 1024 * 1024


@pytest.fixture(scope="module")
def real_node() -> Iterator[RealNode]:
    """The node with the Debian test image, the stand-in vLLM image and the operator's image, kept imported in a
    containerd root under the images cache (importing the 6 GB image takes minutes; a warm run finds it there)."""
    vllm_python()  # the vLLM environment the image is made of (scripts/setup-vllm.sh; cached)
    workdir = Path(tempfile.mkdtemp(prefix="cpullm-node-"))  # short: the kubelet's unix sockets live under it
    cluster = LocalCluster.start(workdir, name=NODE_CLUSTER_NAME, real_node=True)
    node = RealNode(
        cluster.kubeconfig,
        workdir / "node",
        kubectl=cluster.kubectl,
        images=("debian", "vllm", "operator"),
        image_store=CACHE / "containerd-root",
    )
    try:
        yield node.start()
    finally:
        node.stop()
        cluster.delete()
        shutil.rmtree(workdir, ignore_errors=True)


def probe_pod(name: str, node: str, image: str) -> dict[str, object]:
    """A Guaranteed pod shaped like the operator's vLLM pods: whole CPUs, seccomp off, SYS_NICE, memory /dev/shm."""
    script = """
grep -E '^(Cpus_allowed_list|Mems_allowed_list|Seccomp|CapEff):' /proc/self/status
echo "memory_limit: $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)"
echo "shm_kib: $(df -k /dev/shm | awk 'NR == 2 {print $2}')"
echo "done: 1"
exec sleep 3600
"""
    resources = {"cpu": "1", "memory": str(MEMORY)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "securityContext": {"seccompProfile": {"type": "Unconfined"}},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["/bin/sh", "-c", script],
                    "securityContext": {"capabilities": {"add": ["SYS_NICE"]}},
                    "resources": {"requests": resources, "limits": resources},
                    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                }
            ],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(SHM)}}],
        },
    }


def test_guaranteed_pod_on_the_real_node_gets_its_exclusive_cpus(real_node: RealNode) -> None:
    api = real_node.api()
    name = f"probe-{uuid.uuid4().hex[:6]}"
    api.apply(probe_pod(name, real_node.name, build_debian().ref))

    def report() -> dict[str, str]:
        lines = real_node.container_log("default", name, "main").splitlines()
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        assert "done" in fields, f"pod {name} has not reported yet: {lines}"
        return {key: value.strip() for key, value in fields.items()}

    try:
        seen = eventually(report, timeout=90, interval=1, what=f"pod {name} output")
        pod = api.get("pod", name, namespace="default")
    finally:  # its CPU is the node's only allocatable one, which the next tests' servers need
        api.run("delete", "pod", name, "-n", "default", "--wait=false")
    assert pod["status"]["qosClass"] == "Guaranteed"
    # The kubelet ran it, not KWOK: its IP comes from the CNI bridge's subnet.
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(real_node.subnet)
    # The static CPU manager's exclusive CPU, as the kubelet checkpointed it, off the reserved CPU 0.
    state = json.loads((real_node.kubelet_dir / "cpu_manager_state").read_text())
    assigned = state["entries"][pod["metadata"]["uid"]]["main"]
    assert seen["Cpus_allowed_list"] == assigned
    cpus = launcher.parse_cpu_list(assigned)
    assert len(cpus) == 1 and 0 not in cpus and set(cpus) <= os.sched_getaffinity(0)
    assert seen["Seccomp"] == "0"
    assert int(seen["CapEff"], 16) >> CAP_SYS_NICE & 1
    assert int(seen["memory_limit"]) == MEMORY
    assert int(seen["shm_kib"]) * 1024 == SHM


# ---------------------------------------------------------------------------------------------------------------
# The operator's own Deployment on the real node: real vLLM in a real pod
# ---------------------------------------------------------------------------------------------------------------

OPERATOR_RELEASE, OPERATOR_NAMESPACE = "cpullm", "cpullm-system"


@pytest.fixture(scope="module")
def serving(real_node: RealNode) -> Iterator[tuple[Kubectl, InClusterOperator, Path]]:
    """The operator as users run it: its image built from the repository's Dockerfile (testbed/images.py,
    build_operator), installed with the Helm chart (its CRD, RBAC and Deployment) and running in a pod on the real
    node, which reaches the API server through the `kubernetes` Service (kube-proxy); and the tests' tiny
    random-weight model in a directory a hostPath PersistentVolume offers to the pods (the spec's modelCache is its
    claim)."""
    kubectl = real_node.api()
    repository, tag = build_operator().ref.rsplit(":", 1)
    helm = Helm(tool_dirs(["helm"])["helm"] / "helm", kubectl.kubeconfig)
    # cpu request 0: on a 2-CPU machine the node's one allocatable CPU is the vLLM server's (static CPU manager).
    install = (
        "install",
        OPERATOR_RELEASE,
        str(CHART),
        "--namespace",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        # --set-string: the tag is hex digits, which `--set` reads as a number when there is no letter among them
        *("--set-string", f"image.repository={repository},image.tag={tag},image.pullPolicy=Never"),
        *("--set-string", "resources.requests.cpu=0"),
        *("--set-string", f"nodeSelector.kubernetes\\.io/hostname={real_node.name}"),
        # The NUMA seccomp profile's DaemonSet, writing under this kubelet's own root directory.
        *("--set", "numaSeccomp.enabled=true", "--set-string", f"numaSeccomp.kubeletRootDir={real_node.kubelet_dir}"),
        # The performance check reads the servers' /metrics this often (60 s by default): two readings a window.
        *("--set", f"performanceCheck.intervalSeconds={PERFORMANCE_CHECK_SECONDS}"),
        *("--wait", "--timeout", "180s"),
    )
    operator = InClusterOperator(kubectl, OPERATOR_NAMESPACE, f"{OPERATOR_RELEASE}-cpullm-operator")
    try:
        helm.run(*install)
    except AssertionError as failed:
        pods = kubectl.run("describe", "pods", "-n", OPERATOR_NAMESPACE, check=False).stdout
        raise AssertionError(f"{failed}\n{pods}\noperator log:\n{operator.log_tail(40)}") from failed
    kubectl.wait_established("cpullmservices.cpullm.io")
    models, python = real_node.workdir / "models", vllm_python()
    make_tiny_model(python, models / TINY)
    if STARTED_MODEL != TINY:
        shutil.copytree(built_model(python, STARTED_MODEL), models / STARTED_MODEL)
    try:
        yield kubectl, operator, models
    finally:
        print(f"\noperator log (in-cluster, last lines):\n{operator.log_tail(30)}")


@pytest.fixture
def namespace(serving: tuple[Kubectl, InClusterOperator, Path]) -> Iterator[str]:
    """A namespace of the test's own with the model cache's claim; its CpuLLMServices are deleted afterwards, pass
    or fail, and their pods gone: the server holds the node's one allocatable CPU, which the next test needs."""
    kubectl, _, models = serving
    name = f"node-{uuid.uuid4().hex[:5]}"
    kubectl.run("create", "namespace", name)
    kubectl.apply(*model_volume(name, str(models)))
    try:
        yield name
    finally:
        kubectl.run("delete", "cpullm", "--all", "-n", name, "--wait=false", check=False)
        eventually(lambda: not server_pods(kubectl, name), timeout=120, what=f"the server pods of {name} gone")


def complete(address: str, tokens: int, model: str) -> tuple[int, float]:
    """One completion of `tokens` tokens (ignore_eos) from `model`; returns the tokens and the seconds it took."""
    body = json.dumps(completion_request(tokens, model)).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"http://{address}:8000/v1/completions", body, headers)
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.loads(response.read())
    return int(answer["usage"]["completion_tokens"]), time.monotonic() - started


def test_the_operators_deployment_serves_real_vllm_on_the_real_node(
    real_node: RealNode, serving: tuple[Kubectl, InClusterOperator, Path], namespace: str
) -> None:
    kubectl, _, models = serving
    # As on a node that has not read the image or the model yet: the first pod to read them is charged for their
    # page cache, which vLLM's KV check counted as used until the launcher's fixes to vLLM (docs/calibration.md);
    # the start-up budget holds for that start too.
    drop_from_page_cache(real_node.containerd_root)
    drop_from_page_cache(models)
    started = time.monotonic()
    kubectl.apply(tiny_served(namespace, models, REAL_NODE_SELECTOR, model=STARTED_MODEL))
    service = ready(kubectl, namespace, "tiny", 1, timeout=900, interval=2)
    to_ready = time.monotonic() - started
    budget = startup_budget(kubectl, namespace)
    assert to_ready < budget / 2, f"start-up took {to_ready:.0f}s of a {budget}s startup probe budget"
    plan = service["status"]["plan"]
    (pod,) = server_pods(kubectl, namespace)
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == real_node.name and pod["status"]["qosClass"] == "Guaranteed"
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(real_node.subnet)

    # Through the Service: its EndpointSlice names the pod, and its ClusterIP (kube-proxy's rules) reaches it.
    slices = kubectl.get("endpointslices", namespace=namespace, **{"kubernetes.io/service-name": "tiny"})
    addresses = [a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]]
    assert addresses == [pod["status"]["podIP"]], addresses
    cluster_ip = kubectl.get("service", "tiny", namespace)["spec"]["clusterIP"]
    complete(cluster_ip, 4, STARTED_MODEL)  # warm-up
    tokens, seconds = complete(cluster_ip, 64, STARTED_MODEL)
    assert tokens == 64

    seen = in_container(kubectl, namespace, name)
    state = json.loads((real_node.kubelet_dir / "cpu_manager_state").read_text())
    assigned = state["entries"][pod["metadata"]["uid"]]["vllm"]
    assert seen["Cpus_allowed_list"] == assigned, (seen, assigned)
    assert_as_planned(seen, plan)
    print(f"real node, RuntimeDefault seccomp + SYS_NICE: migrate_pages {seen['numa_migrate_pages']}")  # recorded
    limit = int(seen["limit"])
    working_set = int(seen["usage"]) - int(seen["inactive_file"])
    # Usage includes page cache, which may grow to the limit and be reclaimed there (seen with a 0.5B model in
    # tests/vllm); what the kubelet evicts on and the OOM killer acts on is the working set.
    assert working_set < limit and int(seen["oom_kills"] or 0) == 0
    assert_never_restarted(kubectl, real_node, kubectl.get("pod", name, namespace))
    log = real_node.container_log_files(pod, "vllm")[-1].read_text(errors="replace")
    corrections = page_cache_left_out(log)
    assert corrections, "vLLM ran without the fix to its KV check (cpullm/vllm_fixes.py)"
    assert f"{vllm_fixes.LOG_PREFIX} warm-up compiles with a {vllm_fixes.WARM_UP_TOKENS}-token step" in log
    assert plan["rankInEngineCore"] and f"{vllm_fixes.LOG_PREFIX} {vllm_fixes.RANK_IN_ENGINE_CORE}" in log
    assert plan["engineCoreForked"] is (f"{vllm_fixes.RANK_IN_ENGINE_CORE}, {vllm_fixes.FORKED}" in log)
    assert f"{vllm_fixes.LOG_PREFIX} {vllm_fixes.CHECKPOINT_DROPPED}" in log
    assert_fixes_reported_loaded(kubectl, namespace, name, plan)

    # The server started again on the same node with the same model cache (the claim): what the first start
    # compiled (the model, in vLLM's AOT compile cache, and inductor's kernels beside it) and inspected (vLLM's
    # model info) is on the model cache, and the second start loads the compiled model from there and writes
    # nothing new.
    first = start_of(real_node, kubectl.get("pod", name, namespace))
    compiled = cache_files(models)
    assert plan["aotCompileCache"], plan
    assert any(f.startswith("torch_compile_cache/torch_aot_compile/") and f.endswith("/model") for f in compiled)
    assert any(f.endswith(".so") for f in compiled), sorted(compiled)[:10]  # inductor's kernels
    kubectl.run("delete", "pod", name, "-n", namespace, "--wait=false")
    again = eventually(
        lambda: replaced_and_ready(kubectl, namespace, pod), timeout=900, interval=2, what="the server started again"
    )
    second = start_of(real_node, again)
    assert cache_files(models) == compiled, "the second start compiled something again"
    again_log = real_node.container_log_files(again, "vllm")[-1].read_text(errors="replace")
    assert f"{vllm_fixes.LOG_PREFIX} {vllm_fixes.AOT_LOADED}" in again_log

    print(
        f"\nreal node: pod start to Ready {to_ready:.0f}s (startup probe budget "
        f"{budget}s); decode {tokens / seconds:.1f} tokens/s through the Service's "
        f"ClusterIP; cpuset {assigned}; cgroup peak {int(seen['peak']) / limit:.2f} and working set "
        f"{working_set / limit:.2f} of the {limit / 2**30:.2f} GiB limit; page cache left out of vLLM's KV "
        f"check up to {max(corrections):.2f} GiB"
    )
    print(
        f"real node, {STARTED_MODEL}: container start to Ready, s (before load + load + compile and warm-up + "
        f"rest): first {first.row()}, second {second.row()}; second / first {second.total / first.total:.2f}"
    )


def assert_never_restarted(kubectl: Kubectl, real_node: RealNode, pod: dict[str, Any]) -> None:
    """The pod's vLLM container has run once; if not, the failure says how the earlier one ended, the pod's events
    (probe failures) and how its log ends (the kubelet keeps the last ended container's log beside the running
    one's)."""
    (status,) = pod["status"]["containerStatuses"]
    if status["restartCount"] == 0:
        return
    meta = pod["metadata"]
    events = kubectl.run(
        "get", "events", "-n", meta["namespace"], "--field-selector", f"involvedObject.uid={meta['uid']}", check=False
    ).stdout
    logs = real_node.container_log_files(pod, "vllm")
    earlier = first_error(logs[0].read_text(errors="replace")) if len(logs) > 1 else "(no earlier log kept)"
    raise AssertionError(
        f"the vLLM container restarted {status['restartCount']} time(s); the last one ended: "
        f"{status.get('lastState')}\nthe pod's events:\n{events}\nthe earlier container's log:\n{earlier}"
    )


def first_error(log: str) -> str:
    """A log's first error with what follows it (vLLM's processes log the root cause before the API server's own
    traceback), then its last lines."""
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if "ERROR" in line or "Traceback" in line), None)
    if start is None:
        return "\n".join(lines[-40:])
    return "\n".join([*lines[max(0, start - 5) : start + 80], "[...]", *lines[-10:]])


def cache_files(models: Path) -> dict[str, float]:
    """The compile cache on the model cache (VLLM_CACHE_ROOT, /models/vllm in the pod): each file's modification
    time by its path."""
    root = models / "vllm"
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*") if p.is_file()}


def replaced_and_ready(kubectl: Kubectl, namespace: str, gone: dict[str, Any]) -> dict[str, Any]:
    """The server pod that replaced `gone`, once Ready."""
    pods = [p for p in server_pods(kubectl, namespace) if p["metadata"]["uid"] != gone["metadata"]["uid"]]
    assert pods, "no new server pod yet"
    ready_condition = next((c for c in pods[0]["status"].get("conditions") or [] if c["type"] == "Ready"), {})
    assert ready_condition.get("status") == "True", ready_condition
    return pods[0]


def page_cache_left_out(log: str) -> list[float]:
    """The page cache (GiB) the fix to vLLM's KV check left out of each of vLLM's usage readings, from its lines in
    the container's log (cpullm/vllm_fixes.py)."""
    pattern = re.escape(vllm_fixes.LOG_PREFIX) + r" cgroup usage \S+ GiB less (\S+) GiB"
    return [float(m) for m in re.findall(pattern, log)]


def start_of(real_node: RealNode, pod: dict[str, Any]) -> StartSplit:
    """The start of the pod's vLLM container, split by its log (the kubelet's pod log directory): from the
    container's start to the pod's Ready condition, timestamps to the second."""
    status = pod["status"]
    log = real_node.container_log_files(pod, "vllm")[-1]  # the running container's, as startedAt below
    started = utc(status["containerStatuses"][0]["state"]["running"]["startedAt"])
    became_ready = utc(next(c for c in status["conditions"] if c["type"] == "Ready")["lastTransitionTime"])
    return start_split(log.read_text(errors="replace"), started, (became_ready - started).total_seconds())


def utc(stamp: str) -> datetime:
    """An API timestamp as a naive UTC datetime (as vLLM stamps its log in the container, whose zone is UTC)."""
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")


def startup_budget(kubectl: Kubectl, namespace: str) -> int:
    probe = kubectl.get("deployment", "tiny", namespace)["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    return int(probe["periodSeconds"]) * int(probe["failureThreshold"])


NUMA_CALLS = ("get_mempolicy", "set_mempolicy", "mbind", "migrate_pages", "move_pages")


def test_numa_calls_and_serving_under_pod_security_restricted_with_the_charts_profile(
    real_node: RealNode, serving: tuple[Kubectl, InClusterOperator, Path]
) -> None:
    """In a namespace enforcing Pod Security restricted, the server runs under the chart's NUMA seccomp profile
    (written to the node by its DaemonSet) with every capability dropped, as a non-root user, and serves; every NUMA
    call vLLM makes succeeds, where the runtime's default profile refuses them without SYS_NICE."""
    kubectl, _, models = serving
    written = real_node.kubelet_dir / "seccomp" / "cpullm" / "numa.json"
    eventually(written.exists, timeout=120, what="the chart's NUMA seccomp profile on the node")
    assert written.read_bytes() == (CHART / "files" / f"numa-seccomp-{arch()}.json").read_bytes()
    # A model volume the server's group owns, as fsGroup leaves a CSI volume (the kubelet changes no hostPath's).
    owned = real_node.workdir / "models-non-root"
    if not owned.exists():
        shutil.copytree(models / TINY, owned / TINY)
        for path in [owned, *owned.rglob("*")]:
            os.chown(path, SERVER_NON_ROOT_UID, SERVER_NON_ROOT_UID)
    name = f"restricted-{uuid.uuid4().hex[:5]}"
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    try:
        kubectl.apply(*model_volume(name, str(owned)))
        # The API server enforces the level: a root pod with SYS_NICE is refused there.
        refused = kubectl.run(
            *("run", "root", "-n", name, "--image", build_debian().ref, "--dry-run=server", "--restart=Never"),
            "--overrides",
            json.dumps(
                {
                    "spec": {
                        "containers": [
                            {
                                "name": "root",
                                "image": build_debian().ref,
                                "securityContext": {"capabilities": {"add": ["SYS_NICE"]}},
                            }
                        ]
                    }
                }
            ),
            check=False,
        )
        assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr
        kubectl.apply(tiny_served(name, owned, REAL_NODE_SELECTOR))
        service = ready(kubectl, name, "tiny", 1, timeout=900, interval=2)
        security = service["status"]["plan"]["security"]
        assert (security["seccompProfile"], security["localhostProfile"]) == ("Localhost", "cpullm/numa.json")
        assert not security.get("capabilities") and security["runAsUser"] == SERVER_NON_ROOT_UID, security
        (pod,) = server_pods(kubectl, name)
        seen = in_container(kubectl, name, pod["metadata"]["name"])
        assert seen["Seccomp"] == "2" and int(seen["CapEff"], 16) == 0 and seen["uid"] == str(SERVER_NON_ROOT_UID), seen
        assert {call: seen[f"numa_{call}"] for call in NUMA_CALLS} == dict.fromkeys(NUMA_CALLS, "ok"), seen
        tokens, _ = complete(pod["status"]["podIP"], 16, TINY)
        assert tokens == 16
        assert_fixes_reported_loaded(kubectl, name, pod["metadata"]["name"], service["status"]["plan"])
        print(f"real node, restricted under the NUMA profile, uid {seen['uid']}: {', '.join(NUMA_CALLS)} ok")
    finally:
        kubectl.run("delete", "cpullm", "--all", "-n", name, "--wait=false", check=False)
        eventually(lambda: not server_pods(kubectl, name), timeout=120, what=f"the server pods of {name} gone")
        kubectl.run("delete", "namespace", name, "--wait=false", check=False)


def test_the_charts_numa_profiles_are_what_their_script_writes_from_containerds_default() -> None:
    """The chart's profiles are generated (scripts/numa-seccomp.sh, containerd's own default profile, built with Go
    and, for arm64, run under qemu-user-static): what is in the tree is what the script writes now."""
    checked = subprocess.run([str(ROOT / "scripts" / "numa-seccomp.sh"), "--check"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_unhappy_paths_on_the_real_node(
    real_node: RealNode, serving: tuple[Kubectl, InClusterOperator, Path], namespace: str
) -> None:
    """A second replica the node cannot admit says why in Ready; a pod deleted by hand comes back; the node
    drained and uncordoned converges again."""
    kubectl, _, models = serving
    kubectl.apply(tiny_served(namespace, models, REAL_NODE_SELECTOR, replicas=2))

    def unschedulable() -> str:
        found = conditions(kubectl.get("cpullm", "tiny", namespace)).get("Ready", {})
        assert found.get("reason") == "Unschedulable", found
        return str(found["message"])

    message = eventually(unschedulable, timeout=120, interval=2, what="Ready=False Unschedulable")
    assert "Insufficient cpu" in message, message
    kubectl.run("scale", "cpullm", "tiny", "-n", namespace, "--replicas=1")
    ready(kubectl, namespace, "tiny", 1, timeout=900, interval=2)

    (pod,) = server_pods(kubectl, namespace)
    kubectl.run("delete", "pod", pod["metadata"]["name"], "-n", namespace, "--wait=false")
    eventually(
        lambda: [p for p in server_pods(kubectl, namespace) if p["metadata"]["uid"] != pod["metadata"]["uid"]],
        timeout=60,
        what="a new server pod",
    )
    ready(kubectl, namespace, "tiny", 1, timeout=900, interval=2)

    def cordoned() -> str:
        found = conditions(kubectl.get("cpullm", "tiny", namespace)).get("Ready", {})
        assert found.get("reason") == "NoEligibleNode" and "cordoned" in found.get("message", ""), found
        return str(found["message"])

    try:
        kubectl.run(
            "drain", real_node.name, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=120s"
        )
        eventually(cordoned, timeout=120, interval=2, what="NoEligibleNode naming the cordon while the node is drained")
    finally:
        kubectl.run("uncordon", real_node.name)
    ready(kubectl, namespace, "tiny", 1, timeout=900, interval=2)


def test_a_pod_that_cannot_start_says_why_in_ready_on_the_real_node(
    real_node: RealNode, serving: tuple[Kubectl, InClusterOperator, Path], namespace: str
) -> None:
    """Made on purpose, one after the other: a Secret the spec names that does not exist, an image no registry
    serves, and an image a real registry serves for another CPU architecture only (the pause container built for
    it, pushed to Debian's docker-registry as one-platform index, as a registry serves a single-arch build). Each
    is the service's Ready reason, with the kubelet's words and the fix, soon after the kubelet says so (no server
    starts: none of them gets that far)."""
    kubectl, _, models = serving

    def ready_reason(reason: str) -> str:
        return not_ready_for(kubectl, namespace, "tiny", reason)

    def replace(**spec: Any) -> None:
        kubectl.run("delete", "cpullm", "tiny", "-n", namespace, "--ignore-not-found")
        eventually(lambda: not server_pods(kubectl, namespace), timeout=120, what="the last server pod gone")
        kubectl.apply(tiny_served(namespace, models, REAL_NODE_SELECTOR, **spec))

    replace(apiKeySecret={"name": "absent", "key": "key"})
    message = eventually(lambda: ready_reason("ContainerConfigError"), timeout=60, interval=2, what="a missing Secret")
    assert 'secret "absent" not found' in message and "spec.apiKeySecret" in message, message

    missing = "localhost:1/cpullm-tests/no-such-vllm:v0.32.0"  # nothing listens on port 1: the pull fails at once
    replace(image=missing)
    message = eventually(lambda: ready_reason("ImagePullFailed"), timeout=60, interval=2, what="an unpullable image")
    assert f"cannot pull {missing}" in message, message

    foreign = {"amd64": "arm64", "arm64": "amd64"}[arch()]
    with local_registry() as registry:
        other_arch = push_index(registry, [build_pause(foreign)], f"cpullm-tests/{foreign}-only:1")
        replace(image=other_arch)
        message = eventually(
            lambda: ready_reason("ImagePullFailed"), timeout=60, interval=2, what=f"an image built for {foreign} only"
        )
    assert f"cannot pull {other_arch}" in message and "no build for the node's CPU architecture" in message, message
    print(f"\nreal node, an image for {foreign} only: {message}")
    kubectl.run("delete", "cpullm", "tiny", "-n", namespace)


def test_a_server_held_below_the_memory_it_needs_is_oom_killed_and_ready_says_so(
    real_node: RealNode, serving: tuple[Kubectl, InClusterOperator, Path], namespace: str
) -> None:
    """Made on purpose: each server container, as soon as it runs, limited to what it uses then (its cgroup written
    behind the kubelet's back). The kernel kills it for memory, the kubelet restarts it and backs off, and the
    service's Ready says OOMKilled with the memory limit the plan gave and the fix."""
    kubectl, _, models = serving
    kubectl.apply(tiny_served(namespace, models, REAL_NODE_SELECTOR))
    held: set[str] = set()

    def oom_killed() -> str:
        hold_new_containers_to_usage(server_pods(kubectl, namespace), held)
        return not_ready_for(kubectl, namespace, "tiny", "OOMKilled")

    message = eventually(oom_killed, timeout=240, interval=0.5, what="Ready naming the kill for memory")
    (pod,) = server_pods(kubectl, namespace)
    limit = pod["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert f"was killed for memory at its memory limit of {limit}" in message, message
    assert "spec.model.weightsBytes" in message, message
    events = kubectl.get("events", namespace=namespace)
    assert any(e.get("reason") == "OOMKilled" and e.get("type") == "Warning" for e in events), events
    print(f"\nreal node, {len(held)} container(s) held to what they used: {message}")
    kubectl.run("delete", "cpullm", "tiny", "-n", namespace)


def keep_busy(address: str, model: str, stop: threading.Event) -> None:
    """Completions to one server, one after the other, until `stop`: decode tokens for every performance check."""
    while not stop.is_set():
        with contextlib.suppress(OSError):  # a slow server's timeout or a refused connection: ask again
            complete(address, 32, model)


def operator_address(kubectl: Kubectl) -> str:
    """The in-cluster operator pod's address (its metrics port is the chart's metrics.port, 8081)."""
    selector = {"app.kubernetes.io/name": "cpullm-operator", "app.kubernetes.io/instance": OPERATOR_RELEASE}
    (pod,) = kubectl.get("pods", namespace=OPERATOR_NAMESPACE, **selector)
    address: str = pod["status"]["podIP"]
    return address


def test_a_server_held_to_fewer_cpus_than_planned_runs_below_its_prediction_and_says_why(
    real_node: RealNode, serving: tuple[Kubectl, InClusterOperator, Path], namespace: str
) -> None:
    """PerformanceAsPredicted on the real node: the operator reads the server's /metrics (vLLM's latencies and the
    launcher's cgroup figures, container_cpu_metrics) while completions keep it busy. Its container's CFS quota cut to
    a tenth of a CPU, it decodes far below its prediction, and the condition names the cause: fewer CPUs than
    planned. A real Prometheus scrapes the server and the operator as the chart's monitors do: every query of the
    chart's dashboard and alert rules returns series, and the alert on a service slower than predicted is raised."""
    kubectl, _, models = serving
    kubectl.apply(tiny_served(namespace, models, REAL_NODE_SELECTOR))
    service = ready(kubectl, namespace, "tiny", 1, timeout=900, interval=2)
    planned = service["status"]["plan"]["cpu"]
    (pod,) = server_pods(kubectl, namespace)
    address = pod["status"]["podIP"]
    with urllib.request.urlopen(f"http://{address}:8000/metrics", timeout=30) as response:
        page = response.read().decode()
    assert re.search(rf"^cpullm_container_cpus {float(planned)}$", page, re.MULTILINE), page[-2000:]

    def verdict(*reasons: str) -> dict[str, Any]:
        found = conditions(kubectl.get("cpullm", "tiny", namespace)).get("PerformanceAsPredicted", {})
        assert found.get("reason") in reasons, found
        return found

    prometheus = Prometheus(
        [
            # As the PodMonitor labels the servers' series, and the ServiceMonitor keeps the operator's (honorLabels).
            Target("servers", f"{address}:8000", {"namespace": namespace, "cpullm_service": "tiny"}),
            Target("operator", f"{operator_address(kubectl)}:8081", {}, honor_labels=True),
        ]
    )
    stop = threading.Event()
    # Four sequences at once: a tenth of a CPU still decodes the tokens a window needs to say anything.
    loads = [threading.Thread(target=keep_busy, args=(address, TINY, stop), daemon=True) for _ in range(4)]
    for load in loads:
        load.start()
    try:
        first = eventually(
            lambda: verdict("AsPredicted", "SlowerThanPredicted", "CPUThrottled"),
            timeout=120,
            interval=2,
            what="a first verdict on the server's speed",
        )
        (status,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "vllm"]
        hold_cpu_to(container_cgroup(status["containerID"].split("://", 1)[1], "cpu"), 0.1)
        held = eventually(
            lambda: verdict("FewerCPUsThanPlanned"), timeout=180, interval=2, what="PerformanceAsPredicted False"
        )
        queries = {**dashboard_queries(namespace, "tiny"), **alert_queries()}

        def every_query_has_series() -> bool:
            empty = [name for name, expr in queries.items() if not prometheus.query(expr)]
            assert not empty, f"queries without series: {empty}"
            return True

        eventually(every_query_has_series, timeout=60, interval=2, what="series for every dashboard and alert query")
        raised = eventually(
            lambda: prometheus.alerts()["CpuLLMServiceSlowerThanPredicted"]["state"] in ("pending", "firing"),
            timeout=60,
            interval=2,
            what="the alert on a service slower than predicted",
        )
        assert raised and all(rule["health"] == "ok" for rule in prometheus.alerts().values()), prometheus.alerts()
    finally:
        stop.set()
        for load in loads:
            load.join(timeout=300)
        prometheus.stop()
    assert held["status"] == "False" and f"may use 0.1 CPUs of the {planned} planned" in held["message"], held
    events = kubectl.get("events", namespace=namespace)
    assert any(e.get("reason") == "FewerCPUsThanPlanned" and e.get("type") == "Warning" for e in events), events
    print(f"\nreal node, performance check: before {first['message']}\nheld to 0.1 CPU: {held['message']}")


def test_the_charts_probe_job_measures_the_real_node_and_its_plans_read_it(
    real_node: RealNode, serving: tuple[Kubectl, InClusterOperator, Path], namespace: str
) -> None:
    """The chart's probe Job on the real node (values probe.*): the vLLM image runs the probe's script the operator's
    image saved, the operator's image publishes the figures as the node's NodePerformance under the probe's own
    ServiceAccount, and the plan of a service already on the node turns from an estimate to the probe's figures.
    The release and the NodePerformance are as before afterwards."""
    kubectl, _, models = serving
    kubectl.apply(tiny_served(namespace, models, REAL_NODE_SELECTOR))

    def predicted(basis: str) -> dict[str, Any] | None:
        plan = (kubectl.get("cpullm", "tiny", namespace).get("status") or {}).get("plan") or {}
        found: dict[str, Any] | None = plan.get("predicted")
        return found if found and found["basis"] == basis else None

    eventually(lambda: predicted("estimate"), timeout=120, what="the plan's estimate")
    helm = Helm(tool_dirs(["helm"])["helm"] / "helm", kubectl.kubeconfig)
    upgrade = ("upgrade", OPERATOR_RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--reuse-values")
    helm.run(*upgrade, *probe_values(real_node.name, vllm_image_ref(), 0.2))
    try:
        measured = probe_measured(kubectl, OPERATOR_NAMESPACE, real_node.name, timeout=600)
        spec = measured["spec"]
        managers = kubectl.run(
            "get", "nodeperformance", real_node.name, "--show-managed-fields", "-o", "jsonpath={..manager}"
        ).stdout
        assert managers == "cpullm-probe", managers
        assert spec["cpu"]["arch"] == os.uname().machine and spec["vllm"], spec["cpu"]
        # The CPUs its pod may use: the server's exclusive CPU (static CPU manager) is not among them.
        assert 1 <= sum(n["cpus"] for n in spec["numaNodes"]) <= len(os.sched_getaffinity(0)), spec["numaNodes"]
        assert all(n["allCores"]["readBytesPerSecond"] > 0 for n in spec["numaNodes"])
        found = eventually(lambda: predicted("probe"), timeout=120, what="the plan from the probe")
        assert real_node.name in found["source"], found
        print(f"\nreal node, the chart's probe Job: {found}")
    finally:
        helm.run(*upgrade, "--set", "probe.nodes=null")
        kubectl.run("delete", "nodeperformance", real_node.name, "--ignore-not-found", check=False)


# GPT-2 writes its fields under its own names (n_embd, n_layer): no formula of the operator reads them.
GPT2 = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
    "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-05, "bos_token_id": 50256, "eos_token_id": 50256,
}  # fmt: skip


def vllms_own_report(config: dict[str, Any]) -> dict[str, Any]:
    """What the vLLM the image is made of says of `config` here, by the same script (the oracle)."""
    with tempfile.TemporaryDirectory(prefix="cpullm-oracle-") as workdir:
        (Path(workdir) / "config.json").write_text(json.dumps(config))
        script = ROOT / "operator" / "cpullm" / "meta_size.py"
        done = subprocess.run(
            [str(vllm_python()), str(script), workdir], capture_output=True, text=True, timeout=600, check=True
        )
    line = [line for line in done.stdout.splitlines() if line.startswith("cpullm-meta-size: ")][-1]
    report: dict[str, Any] = json.loads(line.removeprefix("cpullm-meta-size: "))
    return report


def test_a_family_no_formula_knows_is_sized_by_vllm_in_a_job_on_the_real_node(
    serving: tuple[Kubectl, InClusterOperator, Path], namespace: str
) -> None:
    """The operator has vLLM size a model its formulas do not know: a Job in the service's vLLM image builds it on
    the meta device on the real node, in a namespace enforcing Pod Security 'restricted'; the plan's weights are
    those vLLM holds, equal to what the same vLLM says here, and its answer is kept in status."""
    kubectl, _, _ = serving
    kubectl.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    service = {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "metadata": {"name": "gpt", "namespace": namespace},
        "spec": {
            "model": {"name": "example/gpt2", "config": GPT2},
            "replicas": 0,
            "kvCacheGiB": 1,
            "maxModelLen": 1024,
            "cpu": {"cpusPerRank": 1},
            "nodeSelector": REAL_NODE_SELECTOR,
        },
    }
    kubectl.apply(service)
    oracle = vllms_own_report(GPT2)

    def planned() -> dict[str, Any] | None:
        status = kubectl.get("cpullm", "gpt", namespace).get("status") or {}
        plan: dict[str, Any] | None = status.get("plan")
        return status if plan and plan["sizing"]["weightsSource"].startswith("vLLM") else None

    status = eventually(planned, timeout=300, interval=2, what="a plan from vLLM's sizing Job")
    plan = status["plan"]
    assert plan["weightsBytes"] == oracle["weights_bytes"], plan
    assert plan["sizing"]["weightsSource"] == f"vLLM {oracle['vllm']} (meta device)"
    assert json.loads(status["vllmSizing"]["report"])["groups"] == oracle["groups"]
    (job,) = kubectl.get("jobs", namespace=namespace, **{"cpullm.io/sizing-for": "gpt"})
    assert job["status"].get("succeeded") == 1, job["status"]
    reasons = [e.get("reason") for e in kubectl.get("events", namespace=namespace)]
    assert "SizingWithVllm" in reasons, reasons
    print(f"\nreal node, sizing Job: {job['metadata']['name']} {plan['weightsBytes']} bytes, as vLLM here")
