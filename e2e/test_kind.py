"""The kind path's parts built here (pytest marker `kind`; root; deselected by default): a Docker engine set up by
scripts/docker.sh and kind's base image built by testbed/kind_images.py from a Debian root filesystem. Checked as kind
uses them: a privileged node container of that image boots systemd with kind's entrypoint, its containerd serves,
and a container runs inside it (the nesting every kind pod relies on); then, on a cluster of the node image (the
quick start's, shared with e2e/test_quickstart.py, so these need the vLLM environment too), kind's default CNI,
the static CPU manager and kind's default storage. Run: python -m pytest e2e/test_kind.py -m kind (first run:
apt-get install docker.io, mmdebstrap of the base, ~1 min; the quick start ~5 min)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from testbed.images import build_debian
from testbed.kind_images import build_kind_base, kind_cni, kind_module, kind_storage
from testbed.spread import NAMESPACE, QuickStart
from testbed.tools import Kubectl, eventually

pytestmark = [pytest.mark.kind, pytest.mark.skipif(os.geteuid() != 0, reason="a Docker engine of our own needs root")]
CHECKS = "kind-checks"  # the namespace of the cluster tests' objects


def docker(env: dict[str, str], *args: str, stdin: Path | None = None) -> subprocess.CompletedProcess[str]:
    with (stdin or Path(os.devnull)).open("rb") as source:
        result = subprocess.run(["docker", *args], env=env, stdin=source, capture_output=True)
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(), result.stderr.decode())


def test_a_kind_node_container_of_the_local_base_image_boots_and_runs_a_nested_container(docker_env):
    base = build_kind_base()
    loaded = docker(docker_env, "load", "--input", str(base.tar))
    assert loaded.returncode == 0 and base.ref in loaded.stdout, loaded.stderr
    name = f"cpullm-kind-base-{uuid.uuid4().hex[:6]}"
    # As kind runs a node: privileged, tmpfs /tmp and /run, an anonymous volume for /var, the host's modules.
    started = docker(
        docker_env,
        *("run", "--detach", "--privileged", "--name", name, "--tmpfs", "/tmp", "--tmpfs", "/run"),
        *("--volume", "/var", "--volume", "/lib/modules:/lib/modules:ro", base.ref),
    )
    assert started.returncode == 0, started.stderr
    try:

        def systemd_state() -> str:
            state = docker(docker_env, "exec", name, "systemctl", "is-system-running").stdout.strip()
            assert state in ("running", "degraded"), f"systemd is {state!r}"
            return state

        eventually(systemd_state, timeout=60, what="systemd up in the node container")
        active = docker(docker_env, "exec", name, "systemctl", "is-active", "containerd").stdout.strip()
        assert active == "active"
        entrypoint_log = docker(docker_env, "logs", name)
        assert "INFO: starting init" in entrypoint_log.stdout + entrypoint_log.stderr  # kind's entrypoint ran

        inner = build_debian()
        imported = docker(
            docker_env,
            "exec",
            "-i",
            name,
            "ctr",
            "-n",
            "k8s.io",
            "images",
            "import",
            "-",
            stdin=inner.tar,
        )
        assert imported.returncode == 0, imported.stderr
        nested = docker(
            docker_env,
            "exec",
            name,
            "ctr",
            "-n",
            "k8s.io",
            "run",
            "--rm",
            inner.ref,
            "nested",
            "sh",
            "-c",
            "grep -c . /etc/os-release && echo nested-ok",
        )
        assert nested.returncode == 0 and nested.stdout.strip().endswith("nested-ok"), nested.stderr
    finally:
        docker(docker_env, "rm", "--force", "--volumes", name)


@pytest.fixture(scope="module")
def kind_cluster(quick_start: QuickStart) -> Iterator[Kubectl]:
    """kubectl on a kind cluster of the images built here: the quick start's (a control plane and two workers of the
    node image of testbed/kind_images.py, with the static CPU manager; testbed/spread.py), shared with
    e2e/test_quickstart.py. The checks' objects go in a namespace of their own, deleted after them."""
    kubectl = quick_start.kubectl
    kubectl.run("create", "namespace", CHECKS)
    try:
        yield kubectl
    finally:
        kubectl.run("delete", "namespace", CHECKS, "--wait=false")


def one_shot_pod(
    name: str, command: list[str], container: Mapping[str, Any] = MappingProxyType({}), **spec: Any
) -> dict[str, Any]:
    """A pod that runs `command` once with kind's storage helper image (busybox; in the node image already);
    `container`: more of its container's fields."""
    image = kind_storage(kind_module()).refs["storageHelperImage"]
    main = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": command, **container}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": CHECKS},
        "spec": {"restartPolicy": "Never", "containers": [main], **spec},
    }


def finished(kubectl: Kubectl, name: str, timeout: float) -> dict[str, Any]:
    """The pod once it has run to its end, succeeded or failed."""

    def ended() -> dict[str, Any]:
        pod: dict[str, Any] = kubectl.get("pod", name, CHECKS)
        status = pod["status"]
        assert status.get("phase") in ("Succeeded", "Failed"), (
            f"{name} {status.get('phase')}: {status.get('conditions')}"
        )
        return pod

    return eventually(ended, timeout=timeout, what=f"pod {name} to run to its end")


def logs(kubectl: Kubectl, pod: str) -> str:
    return kubectl.run("logs", pod, "-n", CHECKS).stdout


def test_kinds_default_cni_runs_on_every_node_and_routes_pods_across_nodes(kind_cluster):
    """kind's own kindnet DaemonSet, with our kindnetd stand-in under kind's image reference, is ready on every
    node, and a pod asks a CoreDNS pod on another node, by that pod's IP, for the kubernetes Service's address:
    pod to pod across nodes, over the stand-in's routes."""
    kubectl = kind_cluster
    kindnet = kubectl.get("daemonset", "kindnet", "kube-system")
    (container,) = kindnet["spec"]["template"]["spec"]["containers"]
    assert container["image"] == kind_cni(kind_module()).refs["kindnetdImage"]
    nodes = {node["metadata"]["name"] for node in kubectl.get("nodes")}
    assert kindnet["status"]["numberReady"] == kindnet["status"]["desiredNumberScheduled"] == len(nodes) == 3
    coredns = kubectl.get("pods", namespace="kube-system", **{"k8s-app": "kube-dns"})[0]
    elsewhere = min(nodes - {coredns["spec"]["nodeName"]})
    pod = one_shot_pod(
        "resolver",
        ["busybox", "nslookup", "-type=a", "kubernetes.default.svc.cluster.local", coredns["status"]["podIP"]],
        nodeSelector={"kubernetes.io/hostname": elsewhere},
        tolerations=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
    )
    kubectl.apply(pod)
    phase = finished(kubectl, "resolver", timeout=120)["status"]["phase"]
    answer = logs(kubectl, "resolver")
    kubernetes = kubectl.get("service", "kubernetes", "default")["spec"]["clusterIP"]
    assert phase == "Succeeded" and f"Address: {kubernetes}\n" in answer, f"{phase} on {elsewhere}: {answer}"


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="an exclusive CPU needs one beside the reserved CPU 0")
def test_a_kind_cluster_of_images_built_here_gives_a_guaranteed_pod_an_exclusive_cpu(kind_cluster):
    """A Guaranteed pod on a worker gets one CPU of its own, not the shared pool (on the worker without the quick
    start's server, which holds its own worker's one)."""
    kubectl = kind_cluster
    workers = {
        n["metadata"]["name"]
        for n in kubectl.get("nodes")
        if "node-role.kubernetes.io/control-plane" not in n["metadata"]["labels"]
    }
    servers = {
        p["spec"]["nodeName"] for p in kubectl.get("pods", namespace=NAMESPACE, **{"cpullm.io/service": "quickstart"})
    }
    free = min(workers - servers)
    pod = one_shot_pod(
        "exclusive",
        ["busybox", "grep", "Cpus_allowed_list", "/proc/self/status"],
        container={"resources": {"limits": {"cpu": "1", "memory": "64Mi"}}},
        nodeSelector={"kubernetes.io/hostname": free},
    )
    kubectl.apply(pod)
    ran = finished(kubectl, "exclusive", timeout=120)
    assert ran["status"]["phase"] == "Succeeded" and ran["status"]["qosClass"] == "Guaranteed", ran["status"]
    allowed = logs(kubectl, "exclusive").split(":", 1)[1].strip()
    assert allowed.isdigit() and allowed != "0", f"not one exclusive CPU beside the reserved CPU 0: {allowed}"
    kubectl.run("delete", "pod", "exclusive", "-n", CHECKS)  # its CPU back for the router test's servers


def test_kinds_default_storage_class_provisions_a_volume_a_pod_writes_to(kind_cluster, docker_env):
    """kind's default StorageClass (rancher.io/local-path, provisioner and helper images built here) binds a claim
    on first use: its helper pod makes the directory on the worker, and the pod's write lands there."""
    kubectl = kind_cluster
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": CHECKS},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}},
    }
    pod = one_shot_pod(
        "writer",
        ["sh", "-c", "echo written-here > /data/proof"],
        container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
    )
    kubectl.apply(claim, pod)

    writer = finished(kubectl, "writer", timeout=180)
    assert writer["status"]["phase"] == "Succeeded", writer["status"]
    bound = kubectl.get("pvc", "data", CHECKS)
    assert (bound["status"]["phase"], bound["spec"]["storageClassName"]) == ("Bound", "standard")
    volume = kubectl.get("pv", bound["spec"]["volumeName"])
    assert volume["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == "rancher.io/local-path"
    host_path = volume["spec"]["hostPath"]["path"] if "hostPath" in volume["spec"] else volume["spec"]["local"]["path"]
    written = docker(docker_env, "exec", writer["spec"]["nodeName"], "cat", f"{host_path}/proof")
    assert written.stdout.strip() == "written-here", written.stderr
