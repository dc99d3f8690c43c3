"""The quick start's kind cluster, as `scripts/quickstart.sh --offline` makes it from images in a registry on
localhost, and a throughput service spread over its two workers ("spread"): what the quick start's tests
(e2e/test_quickstart.py) and the routing benchmark (bench/routing_bench.py) share.

The cluster config is the kind tests' (testbed/kind_cluster.py: the static CPU manager, and the settings a cgroup v1
host or a missing CAP_SYS_RESOURCE need) with two workers, plus the containerd registry directory the quick
start's own config sets. Each kind node sees this machine's every CPU, and each kubelet gives its exclusive CPU
from the same list: two servers on two workers share the host's CPUs as the host's one kubelet would not let
them."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed import netpol
from testbed.cgroup import mount_unmounted_v1_hierarchies
from testbed.cluster import tool_dirs, tool_version
from testbed.images import CACHE, build_haproxy, build_kube_router, build_vllm, log
from testbed.kind_cluster import cgroup_v1_host, cluster_config
from testbed.kind_images import build_kind_node
from testbed.operator import ready
from testbed.realnode import lacks_cap_sys_resource
from testbed.registry import Registry, local_registry, push_archive
from testbed.release import Release, release_into
from testbed.tools import ROOT, Kubectl, free_port, metric_total, parse_metrics, require_free_space
from testbed.vllm_server import TINY, make_tiny_model, vllm_python

NAME = "cpullm-quickstart-test"
REGISTRY_DIRECTORY = '[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
SPREAD = "spread"
QUICK_START_DISK_BYTES = 34 * 10**9
NAMESPACE = "default"
NODE_MODELS = "/var/lib/cpullm-quickstart"  # scripts/quickstart.sh's copy of the model, each node's /models


@dataclass(frozen=True)
class QuickStart:
    """What the quick start left: its output, its cluster (kept while the context lasts), the registry and the
    release of this tree in it, whose chart the quick start installed."""

    run: subprocess.CompletedProcess[str]
    kubectl: Kubectl
    registry: Registry
    vllm: str  # the vLLM image's reference in the registry
    release: Release


# The kubelets sync each pod every 10 s, not every minute: a Secret's change reaches a pod's files within a sync
# (the gateway's key rotation in e2e/test_quickstart.py waited 60-90 s for it). The same path, only sooner.
KUBELET_SYNC = json.dumps({"kind": "KubeletConfiguration", "syncFrequency": "10s"})


def kind_config(path: Path) -> Path:
    config = cluster_config(NAME, 2, cgroup_v1=cgroup_v1_host(), lacks_cap=lacks_cap_sys_resource())
    config["containerdConfigPatches"] = [*config.get("containerdConfigPatches", []), REGISTRY_DIRECTORY]
    config["kubeadmConfigPatches"].append(KUBELET_SYNC)
    path.write_text(json.dumps(config, indent=1))
    return path


@contextmanager
def quick_start_cluster(
    docker_env: dict[str, str], workdir: Path, model_dir: Path | None = None
) -> Iterator[QuickStart]:
    """The quick start run from no cluster (asserted to succeed) with the model in `model_dir` (default: the tests'
    tiny model), its cluster deleted at the end."""
    # Measured: 31.7 GB at the most, with both workers running vLLM (the registry's uncompressed copy of the 6 GB
    # image, and each worker's blob and unpacked snapshot of it).
    require_free_space([workdir, CACHE], QUICK_START_DISK_BYTES, "the quick start's cluster with two workers")
    mount_unmounted_v1_hierarchies()  # the nodes' containerd sees them: kills for memory read as OOMKilled
    tools = tool_dirs(["kubernetes", "helm", "kind"])
    model_dir = model_dir or make_tiny_model(vllm_python(), workdir / TINY)
    env = {**docker_env, "PATH": os.pathsep.join([*(str(d) for d in tools.values()), docker_env["PATH"]])}
    with local_registry() as registry:
        # kind's node image under the registry's name in Docker's store, not pushed: kind pulls a node image only
        # when the store lacks it, so a push (its gzip of 2.1 GB, ~1 min) would never be read back.
        node_image = f"{registry.host}/kindest/node:{tool_version('KUBERNETES')}"
        subprocess.run(["docker", "tag", build_kind_node(docker_env), node_image], env=docker_env, check=True)
        # The operator as released (scripts/release.sh): its chart, from the registry, is what the quick start installs.
        release = release_into(registry, chart_app_version(), workdir / "release")
        # The stand-in carries the published image's reference: pushed under its path, where the quick start looks
        # for the image the plan names.
        vllm_image = build_vllm()
        vllm = push_archive(registry, vllm_image, vllm_image.ref.split("/", 1)[1])
        command = [
            str(ROOT / "scripts" / "quickstart.sh"),
            *("--offline", "--registry", registry.host, "--model-dir", str(model_dir), "--chart", release.chart),
            *("--name", NAME, "--kind-config", str(kind_config(workdir / "kind.json")), "--port", str(free_port())),
            *("--timeout", "900"),
        ]
        try:
            run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            log(f"quickstart.sh (exit {run.returncode}):\n{run.stdout}{run.stderr}")
            # The latest run's transcript, kept for docs/quickstart.md (outside the clone: a test writes no tree).
            (CACHE / "quickstart-transcript.txt").write_text(f"$ {' '.join(command)}\n{run.stdout}")
            assert run.returncode == 0, run.stderr[-2000:]
            kubectl = cluster_kubectl(tools, env, workdir / "kubeconfig")
            enforce_network_policies(kubectl, registry)
            yield QuickStart(run, kubectl, registry, vllm, release)
        finally:
            subprocess.run([str(tools["kind"] / "kind"), "delete", "cluster", "--name", NAME], env=env, check=False)
            subprocess.run(["docker", "rmi", node_image], env=env, check=False, stdout=subprocess.DEVNULL)


def enforce_network_policies(kubectl: Kubectl, registry: Registry) -> None:
    """kube-router's firewall on every node (testbed/netpol.py, its image from the registry), from the quick start's
    end on: the tests after it (the router's, the policies' own) run with the operator's NetworkPolicies enforced.
    No resource request: the planner leaves room for what DaemonSets request, and the quick start's plan stays."""
    image = build_kube_router()
    pushed = push_archive(registry, image, image.ref.split("/", 1)[1])
    for manifest in netpol.manifests(pushed, requests={}):
        kubectl.apply(manifest)
    kubectl.run("rollout", "status", "daemonset", netpol.NAME, "-n", netpol.NAMESPACE, "--timeout=180s")


def chart_app_version() -> str:
    return str(yaml.safe_load((ROOT / "charts" / "cpullm-operator" / "Chart.yaml").read_text())["appVersion"])


def cluster_kubectl(tools: dict[str, Path], env: dict[str, str], kubeconfig: Path) -> Kubectl:
    """kubectl on the quick start's cluster (the script keeps no kubeconfig behind)."""
    run = subprocess.run(
        [str(tools["kind"] / "kind"), "get", "kubeconfig", "--name", NAME],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    kubeconfig.write_text(run.stdout)
    return Kubectl(str(tools["kubernetes"] / "kubectl"), str(kubeconfig))


def put_on_nodes(docker_env: dict[str, str], kubectl: Kubectl, source: Path, name: str) -> str:
    """`source` copied to every node as the quick start copies its model (beside it, under `name`): returns its path
    in a server, where the quick start's model cache is mounted."""
    for node in kubectl.get("nodes"):
        container = node["metadata"]["name"]  # a kind node is the Docker container of its name
        subprocess.run(["docker", "exec", container, "rm", "-rf", f"{NODE_MODELS}/{name}"], env=docker_env, check=True)
        subprocess.run(["docker", "cp", str(source), f"{container}:{NODE_MODELS}/{name}"], env=docker_env, check=True)
    return f"/models/{name}"


def deploy_spread(quick_start: QuickStart, replicas: int, **spec: Any) -> str:
    """In place of the quick start's service (whose worker's CPU it needs): "spread", throughput placement of the
    quick start's model and image over the two workers behind the router (HAProxy pushed into the registry), once
    Ready with `replicas` servers and a ready router. Returns the model's name."""
    kubectl = quick_start.kubectl
    quickstart = kubectl.get("cpullmservice", "quickstart", NAMESPACE)
    if quickstart is not None:
        kubectl.run("delete", "cpullmservice", "quickstart", "-n", NAMESPACE, "--wait=true")
        base = {k: quickstart["spec"][k] for k in ("model", "image", "kvCacheGiB", "maxModelLen", "modelCache")}
    else:
        base = kubectl.get("cpullmservice", SPREAD, NAMESPACE)["spec"]
    haproxy = build_haproxy()
    router_image = push_archive(quick_start.registry, haproxy, haproxy.ref.split("/", 1)[1])
    body = {
        **base,
        "maxNumSeqs": 2,
        "placement": "throughput",
        "replicas": replicas,
        "routing": {"mode": "router", "router": {"image": router_image}, "drainSeconds": 120},
        **spec,
    }
    metadata = {"name": SPREAD, "namespace": NAMESPACE}
    kubectl.apply({"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService", "metadata": metadata, "spec": body})
    try:
        ready(kubectl, NAMESPACE, SPREAD, replicas, timeout=600, interval=2)
    except AssertionError as failed:  # the cluster goes with the context: say here what its pods went through
        pods = kubectl.run("describe", "pods", "-n", NAMESPACE, "-l", f"cpullm.io/service={SPREAD}", check=False)
        events = kubectl.run("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp", check=False)
        raise AssertionError(f"{failed}\n{pods.stdout}\n{events.stdout[-6000:]}") from failed
    return str(body["model"]["name"])


def router_ready(kubectl: Kubectl) -> bool:
    router = kubectl.get("deployment", f"{SPREAD}-router", NAMESPACE)
    assert router is not None, "no router Deployment"
    return bool((router.get("status") or {}).get("readyReplicas") == 1)


def scale(kubectl: Kubectl, replicas: int) -> None:
    kubectl.run("scale", "cpullmservice", SPREAD, "-n", NAMESPACE, f"--replicas={replicas}")


def patch_spec(kubectl: Kubectl, spec: dict[str, Any]) -> None:
    kubectl.run("patch", "cpullmservice", SPREAD, "-n", NAMESPACE, "--type=merge", "-p", json.dumps({"spec": spec}))


READ_METRICS = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/metrics').read().decode())"


def served(kubectl: Kubectl) -> dict[str, float]:
    """Requests each running server finished (vLLM's vllm:request_success_total)."""
    return {pod: counts[0] for pod, counts in server_counters(kubectl, ("vllm:request_success_total",)).items()}


def server_counters(kubectl: Kubectl, names: tuple[str, ...], service: str = SPREAD) -> dict[str, list[float]]:
    """Each running server's sums of the vLLM counters `names` (every series of each), read inside the pod: the API
    server's proxy to it comes from another node, which the servers' NetworkPolicy refuses."""
    counts = {}
    for pod in kubectl.get("pods", namespace=NAMESPACE, **{"cpullm.io/service": service}):
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") != "Running":
            continue
        metrics = kubectl.run("exec", name, "-n", NAMESPACE, "-c", "vllm", "--", "python3", "-c", READ_METRICS).stdout
        samples = parse_metrics(metrics)
        counts[name] = [metric_total(samples, wanted) for wanted in names]
    return counts


def servers_generation(kubectl: Kubectl) -> int:
    return int(kubectl.get("deployment", SPREAD, NAMESPACE)["metadata"]["generation"])


def rolled_out(kubectl: Kubectl, replicas: int, after: int) -> bool:
    """Whether the servers' Deployment has a template newer than generation `after`, all of its pods updated
    and ready."""
    deployment = kubectl.get("deployment", SPREAD, NAMESPACE)
    status, generation = deployment.get("status") or {}, deployment["metadata"]["generation"]
    assert generation > after, "the operator has not applied the new template yet"
    assert status.get("observedGeneration") == generation, status
    counts = (status.get("updatedReplicas"), status.get("readyReplicas"), status.get("replicas"))
    return counts == (replicas, replicas, replicas)
