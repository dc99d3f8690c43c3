"""The kind path's parts built here (pytest marker `kind`; root; deselected by default): a Docker engine set up by
scripts/docker.sh and kind's base image built by testbed/kind_images.py from a Debian root filesystem. Checked as kind
uses them: a privileged node container of that image boots systemd with kind's entrypoint, its containerd serves,
and a container runs inside it (the nesting every kind pod relies on). Run: python -m pytest e2e/test_kind.py -m kind
(first run: apt-get install docker.io, mmdebstrap of the base, ~1 min)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from testbed.cluster import tool_dirs
from testbed.images import build_debian
from testbed.kind_cluster import KindCluster
from testbed.kind_images import build_kind_base, build_kind_node, kind_cni, kind_module, kind_storage
from testbed.tools import eventually

pytestmark = [pytest.mark.kind, pytest.mark.skipif(os.geteuid() != 0, reason="a Docker engine of our own needs root")]


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
def kind_cluster(docker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindCluster]:
    """kind with nothing pulled: the node image of testbed/kind_images.py (kubeadm, kubelet, the control-plane images,
    etcd, CoreDNS, pause, kind's default storage and a stand-in for kindnetd all built here), the static CPU manager;
    a control plane and one worker."""
    node_image = build_kind_node(docker_env)
    tools = tool_dirs(["kind", "kubernetes"])
    name = f"cpullm-{uuid.uuid4().hex[:6]}"
    kubectl = tools["kubernetes"] / "kubectl"
    cluster = KindCluster(name, tools["kind"] / "kind", kubectl, tmp_path_factory.mktemp("kind"), docker_env)
    cluster.create(node_image, workers=1)
    try:
        cluster.run_kubectl("-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s")
        yield cluster
    finally:
        cluster.delete()


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
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never", "containers": [main], **spec},
    }


def finished(cluster: KindCluster, name: str, timeout: float) -> dict[str, Any]:
    """The pod once it has run to its end, succeeded or failed."""

    def ended() -> dict[str, Any]:
        pod: dict[str, Any] = cluster.kubectl_json("get", "pod", name)
        status = pod["status"]
        assert status.get("phase") in ("Succeeded", "Failed"), (
            f"{name} {status.get('phase')}: {status.get('conditions')}"
        )
        return pod

    return eventually(ended, timeout=timeout, what=f"pod {name} to run to its end")


def test_kinds_default_cni_runs_on_every_node_and_routes_pods_across_nodes(kind_cluster):
    """kind's own kindnet DaemonSet, with our kindnetd stand-in under kind's image reference, is ready on every
    node, and a pod asks a CoreDNS pod on another node, by that pod's IP, for the kubernetes Service's address:
    pod to pod across nodes, over the stand-in's routes."""
    cluster = kind_cluster
    kindnet = cluster.kubectl_json("-n", "kube-system", "get", "daemonset", "kindnet")
    (container,) = kindnet["spec"]["template"]["spec"]["containers"]
    assert container["image"] == kind_cni(kind_module()).refs["kindnetdImage"]
    assert kindnet["status"]["numberReady"] == kindnet["status"]["desiredNumberScheduled"] == 2
    coredns = cluster.kubectl_json("-n", "kube-system", "get", "pods", "-l", "k8s-app=kube-dns")["items"][0]
    nodes = {f"{cluster.name}-control-plane", f"{cluster.name}-worker"}
    (elsewhere,) = nodes - {coredns["spec"]["nodeName"]}
    pod = one_shot_pod(
        "resolver",
        ["busybox", "nslookup", "-type=a", "kubernetes.default.svc.cluster.local", coredns["status"]["podIP"]],
        nodeSelector={"kubernetes.io/hostname": elsewhere},
        tolerations=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
    )
    cluster.run_kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    phase = finished(cluster, "resolver", timeout=120)["status"]["phase"]
    logs = cluster.run_kubectl("logs", "resolver").stdout
    kubernetes = cluster.kubectl_json("get", "service", "kubernetes")["spec"]["clusterIP"]
    assert phase == "Succeeded" and f"Address: {kubernetes}\n" in logs, f"{phase} on {elsewhere}: {logs}"


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="an exclusive CPU needs one beside the reserved CPU 0")
def test_a_kind_cluster_of_images_built_here_gives_a_guaranteed_pod_an_exclusive_cpu(kind_cluster):
    """A Guaranteed pod on the worker gets one CPU of its own, not the shared pool."""
    cluster = kind_cluster
    pod = one_shot_pod(
        "exclusive",
        ["busybox", "grep", "Cpus_allowed_list", "/proc/self/status"],
        container={"resources": {"limits": {"cpu": "1", "memory": "64Mi"}}},
        nodeSelector={"kubernetes.io/hostname": f"{cluster.name}-worker"},
    )
    cluster.run_kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    assert finished(cluster, "exclusive", timeout=120)["status"]["phase"] == "Succeeded"
    allowed = cluster.run_kubectl("logs", "exclusive").stdout.split(":", 1)[1].strip()
    assert cluster.kubectl_json("get", "pod", "exclusive")["status"]["qosClass"] == "Guaranteed"
    assert allowed.isdigit() and allowed != "0", f"not one exclusive CPU beside the reserved CPU 0: {allowed}"


def test_kinds_default_storage_class_provisions_a_volume_a_pod_writes_to(kind_cluster):
    """kind's default StorageClass (rancher.io/local-path, provisioner and helper images built here) binds a claim
    on first use: its helper pod makes the directory on the worker, and the pod's write lands there."""
    cluster = kind_cluster
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}},
    }
    pod = one_shot_pod(
        "writer",
        ["sh", "-c", "echo written-here > /data/proof"],
        container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
    )
    cluster.run_kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [claim, pod]})
    )

    writer = finished(cluster, "writer", timeout=180)
    assert writer["status"]["phase"] == "Succeeded", writer["status"]
    bound = cluster.kubectl_json("get", "pvc", "data")
    assert (bound["status"]["phase"], bound["spec"]["storageClassName"]) == ("Bound", "standard")
    volume = cluster.kubectl_json("get", "pv", bound["spec"]["volumeName"])
    assert volume["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == "rancher.io/local-path"
    host_path = volume["spec"]["hostPath"]["path"] if "hostPath" in volume["spec"] else volume["spec"]["local"]["path"]
    written = docker(cluster.docker_env, "exec", writer["spec"]["nodeName"], "cat", f"{host_path}/proof")
    assert written.stdout.strip() == "written-here", written.stderr
