"""`cpullm plan --from-cluster` against the real API server: the nodes read from the kubeconfig's cluster plan
as the listing `kubectl get nodes -o yaml` prints does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testbed.tools import ROOT, Kubectl


def cpullm(*args: str, kubeconfig: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    env.pop("KUBERNETES_SERVICE_HOST", None)  # the kubeconfig's cluster, even when the suite runs in a pod
    return subprocess.run(
        [sys.executable, "-m", "cpullm", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_plan_from_the_cluster_equals_the_plan_from_its_node_listing(cluster_ready: Kubectl, tmp_path: Path):
    example = str(ROOT / "manifests" / "examples" / "qwen-small.yaml")
    listing = tmp_path / "nodes.yaml"
    listing.write_text(cluster_ready.run("get", "nodes", "-o", "yaml").stdout)
    from_file = cpullm("plan", example, "--nodes", str(listing), "-o", "json", kubeconfig=cluster_ready.kubeconfig)
    from_cluster = cpullm("plan", example, "--from-cluster", "-o", "json", kubeconfig=cluster_ready.kubeconfig)
    assert from_file.returncode == 0, from_file.stderr
    assert from_cluster.returncode == 0, from_cluster.stderr
    plan = json.loads(from_cluster.stdout)
    assert plan == json.loads(from_file.stdout)
    assert plan["eligibleNodes"]  # the suite's sample nodes
