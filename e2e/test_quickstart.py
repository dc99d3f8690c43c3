"""The README's quick start, end to end, as a user runs it (pytest marker `kind`; root): `scripts/quickstart.sh
--offline` from a machine with no cluster, with every image pulled from a real registry on localhost (Debian's
docker-registry, e2e/registry.py) into which the images built here are pushed first: kind's node image (the kind
tests' own), the operator's and the stand-in vLLM image (the real-node tests'). The model is the tiny
random-weight one of the vLLM tests, from a local directory. Needs the vLLM environment (scripts/setup-vllm.sh).

On this machine the cluster config is the kind tests' (e2e/kind_cluster.py: the static CPU manager, and the
settings a cgroup v1 host or a missing CAP_SYS_RESOURCE need) plus the containerd registry directory the
quick start's own config sets."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.vllm.harness import free_port, make_tiny_model, vllm_python

from cpullm.core.topology import parse_quantity
from e2e.cluster import tool_dirs, tool_version
from e2e.helpers import ROOT, Kubectl
from e2e.images import VLLM_VENV, build_operator, build_vllm, log
from e2e.kind_cluster import cgroup_v1_host, cluster_config
from e2e.kind_images import build_kind_node
from e2e.realnode import lacks_cap_sys_resource
from e2e.registry import local_registry, push_archive, push_docker_image
from e2e.serving import TINY, assert_as_planned, in_container

pytestmark = [
    pytest.mark.kind,
    pytest.mark.skipif(os.geteuid() != 0, reason="a Docker engine of our own needs root"),
    pytest.mark.skipif(not (VLLM_VENV / ".complete").exists(), reason="needs the vLLM environment (setup-vllm.sh)"),
]
NAME = "cpullm-quickstart-test"
REGISTRY_DIRECTORY = '[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
PHASES = ("pulling the image", "loading the model", "ready", "completion:")


def kind_config(path: Path) -> Path:
    config = cluster_config(NAME, 1, cgroup_v1=cgroup_v1_host(), lacks_cap=lacks_cap_sys_resource())
    config["containerdConfigPatches"] = [*config.get("containerdConfigPatches", []), REGISTRY_DIRECTORY]
    path.write_text(json.dumps(config, indent=1))
    return path


def test_the_quick_start_serves_a_completion_from_images_pulled_from_a_registry(
    docker_env: dict[str, str], tmp_path: Path
) -> None:
    tools = tool_dirs(["kubernetes", "helm", "kind"])
    make_tiny_model(vllm_python(), tmp_path / TINY)
    env = {**docker_env, "PATH": os.pathsep.join([*(str(d) for d in tools.values()), docker_env["PATH"]])}
    with local_registry() as registry:
        node_image = build_kind_node(docker_env)
        pushed_node_image = push_docker_image(
            registry, docker_env, node_image, f"kindest/node:{tool_version('KUBERNETES')}"
        )
        push_archive(registry, build_operator(), f"cpullm-operator:{chart_app_version()}")
        # The stand-in carries the published image's reference: pushed under its path, where the quick start looks
        # for the image the plan names.
        vllm_image = build_vllm()
        vllm = push_archive(registry, vllm_image, vllm_image.ref.split("/", 1)[1])
        command = [
            str(ROOT / "scripts" / "quickstart.sh"),
            *("--offline", "--registry", registry.host, "--model-dir", str(tmp_path / TINY)),
            *("--name", NAME, "--kind-config", str(kind_config(tmp_path / "kind.json")), "--port", str(free_port())),
            *("--timeout", "900"),
        ]
        try:
            run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            log(f"quickstart.sh (exit {run.returncode}):\n{run.stdout}{run.stderr}")
            assert run.returncode == 0, run.stderr[-2000:]
            kubectl = cluster_kubectl(tools, env, tmp_path / "kubeconfig")
            (pod,) = kubectl.get("pods", namespace="default", **{"cpullm.io/service": "quickstart"})
            plan = kubectl.get("cpullmservice", "quickstart", "default")["status"]["plan"]
            seen = in_container(kubectl, "default", pod["metadata"]["name"])
            worker = kubectl.get("node", pod["spec"]["nodeName"])
            kindnet = kubectl.get("daemonset", "kindnet", "kube-system")
        finally:
            subprocess.run([str(tools["kind"] / "kind"), "delete", "cluster", "--name", NAME], env=env, check=False)
            subprocess.run(["docker", "rmi", pushed_node_image], env=env, check=False, stdout=subprocess.DEVNULL)

    out = run.stdout
    # Each phase was shown, in order, with its elapsed time.
    positions = [out.find(f"] {phase}") if phase == "completion:" else out.find(f"]   {phase}") for phase in PHASES]
    assert -1 not in positions and positions == sorted(positions), out
    answer = json.loads(next(line for line in out.splitlines() if line.startswith('{"id"')))
    assert answer["model"] == f"/models/{TINY}" and answer["usage"]["completion_tokens"] >= 1, answer
    assert "kind delete cluster --name " + NAME in out
    # The server's image came from the registry (its repo digest names it), not from a preloaded store.
    image_id = pod["status"]["containerStatuses"][0]["imageID"]
    assert image_id.startswith(vllm.rsplit(":", 1)[0] + "@sha256:"), image_id
    # The README's example asks for the whole worker: what kind's kindnet DaemonSet leaves of it, in whole CPUs.
    kindnet_cpu = sum(
        parse_quantity(c["resources"]["requests"]["cpu"]) for c in kindnet["spec"]["template"]["spec"]["containers"]
    )
    assert plan["cpu"] == math.floor(parse_quantity(worker["status"]["allocatable"]["cpu"]) - kindnet_cpu) >= 1
    assert "left on the nodes for: kube-system/kindnet" in plan["placementNote"]
    # As planned, under the kind tests' static CPU manager: exclusive CPUs holding every thread, the runtime's
    # seccomp filter, SYS_NICE alone, /dev/shm and the memory limit, no OOM kill.
    assert pod["status"]["qosClass"] == "Guaranteed"
    assert_as_planned(seen, plan)


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
