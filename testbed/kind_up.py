"""Brings up what testbed/kind/run.sh runs the suite against, with nothing pulled from a registry: a kind cluster of
the node image built here (control plane + 2 workers, testbed/kind_cluster.py), KWOK's controller and fast stages
rendered from the pinned KWOK module (kustomize) with its image built here, and the operator's image built from the
Dockerfile (testbed/images.py) loaded into kind and installed with the chart on one real worker.

Usage (root, a Docker engine in DOCKER_HOST): python3 -m testbed.kind_up WORKDIR NAME; prints KEY=value lines
(CPULLM_E2E_KUBECONFIG, CPULLM_E2E_KUBECTL, CPULLM_E2E_OPERATOR; for e2e/test_in_kind.py CPULLM_E2E_KIND_SERVER_NODE,
the worker kept for its servers, and CPULLM_E2E_KIND_TEST_IMAGE, the Python base image loaded there) for the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testbed.cluster import tool_dirs, tool_version
from testbed.images import ROOT, build_operator, build_python_base, go_module_dir, log
from testbed.kind_cluster import KindCluster
from testbed.kind_images import binary_image, build_kind_node

KWOK_IMAGE = "registry.k8s.io/kwok/kwok"
RELEASE = "kind-operator"
NAMESPACE = "cpullm-operator"


def install_kwok(cluster: KindCluster, kwok_bin: Path) -> None:
    """KWOK's controller (kustomize/kwok) and its fast stages, as the release's kwok.yaml and stage-fast.yaml are
    made, with the controller's image built here from our kwok build."""
    ref = f"{KWOK_IMAGE}:{tool_version('KWOK')}"
    image = binary_image("kwok", ref, [kwok_bin / "kwok"], Entrypoint=["/usr/local/bin/kwok"])
    cluster.load_archive(image.tar)
    module = go_module_dir("sigs.k8s.io/kwok", tool_version("KWOK")) / "kustomize"
    for kustomization in ("kwok", "stage/fast"):
        rendered = cluster.run_kubectl("kustomize", str(module / kustomization)).stdout
        cluster.run_kubectl("apply", "-f", "-", stdin=rendered.replace(f"image: {KWOK_IMAGE}\n", f"image: {ref}\n"))
    cluster.run_kubectl("-n", "kube-system", "rollout", "status", "deployment/kwok-controller", "--timeout=120s")
    # kind's kindnet DaemonSet tolerates every taint: it is kept off KWOK's fake nodes (labelled type=kwok, like
    # KWOK's example nodes), which have no network to set up and whose whole capacity some of the suite's plans
    # take (kindnet requests 100m CPU and 50Mi on each node it runs on).
    off_fake_nodes = {"key": "type", "operator": "NotIn", "values": ["kwok"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [off_fake_nodes]}]
            }
        }
    }
    patch = json.dumps({"spec": {"template": {"spec": {"affinity": affinity}}}})
    cluster.run_kubectl("-n", "kube-system", "patch", "daemonset", "kindnet", "--type", "merge", "--patch", patch)
    cluster.run_kubectl("-n", "kube-system", "rollout", "status", "daemonset/kindnet", "--timeout=120s")


def install_operator(cluster: KindCluster, helm: Path, worker: str) -> str:
    """The operator's image (the Dockerfile, built by buildah on the local Python base) loaded into kind, and the
    chart installed with it on one worker (labelled cpullm.io/operator-host=true): the other worker's one
    allocatable CPU stays whole for e2e/test_in_kind.py's servers, wherever the fault tests restart the operator."""
    image = build_operator()
    cluster.load_archive(image.tar, worker)
    cluster.run_kubectl("label", "node", worker, "cpullm.io/operator-host=true", "--overwrite")
    repository, tag = image.ref.rsplit(":", 1)
    subprocess.run(
        [
            str(helm),
            *("--kubeconfig", str(cluster.kubeconfig), "install", RELEASE, str(ROOT / "charts" / "cpullm-operator")),
            *("--namespace", NAMESPACE, "--create-namespace", "--wait", "--timeout", "180s"),
            # --set-string: the tag is hex digits, which `--set` reads as a number when there is no letter among them
            *("--set-string", f"image.repository={repository},image.tag={tag},image.pullPolicy=Never"),
            *("--set-string", "nodeSelector.cpullm\\.io/operator-host=true"),
            # The suite runs other releases' operators beside this cluster-wide one (e2e/test_chart.py), whose
            # writes to children a cluster-wide child policy refuses, as it would any writer but its own release:
            # off here; test_chart.py's own release tests it, and the quick start installs it on.
            *("--set", "childPolicy.enabled=false"),
        ],
        check=True,
        stdout=sys.stderr,
    )
    return f"{NAMESPACE}/{RELEASE}-cpullm-operator"


def main(argv: list[str]) -> int:
    workdir, name = Path(argv[0]), argv[1]
    workdir.mkdir(parents=True, exist_ok=True)
    docker_env = dict(os.environ)
    tools = tool_dirs(["kubernetes", "kwok", "helm", "kind"])
    node_image = build_kind_node(docker_env)
    cluster = KindCluster(name, tools["kind"] / "kind", tools["kubernetes"] / "kubectl", workdir, docker_env)
    cluster.create(node_image, workers=2)
    log("kind: installing KWOK")
    install_kwok(cluster, tools["kwok"])
    operator_worker, server_worker = cluster.workers()
    log("kind: installing the operator")
    operator = install_operator(cluster, tools["helm"] / "helm", operator_worker)
    # e2e/test_in_kind.py's server image, with python3 for the launcher (it logs its cpuset; then vLLM is missing)
    test_image = build_python_base()
    cluster.load_archive(test_image.tar, server_worker)
    print(f"CPULLM_E2E_KUBECONFIG={cluster.kubeconfig}")
    print(f"CPULLM_E2E_KUBECTL={tools['kubernetes'] / 'kubectl'}")
    print(f"CPULLM_E2E_OPERATOR={operator}")
    print(f"CPULLM_E2E_KIND_SERVER_NODE={server_worker}")
    print(f"CPULLM_E2E_KIND_TEST_IMAGE={test_image.ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
