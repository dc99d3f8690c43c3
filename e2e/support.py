"""What the e2e suites share (and bench/ with them): waiting for a service's conditions, the suite's KWOK node
pool, creating services in bulk and waiting for them to settle, the operator's log since a mark, the optional
APIs' CRDs, and Helm. Test modules import from here, never from each other (pyproject.toml's import contracts)."""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testbed.objects import fake_node, tiny_service
from testbed.operator import Operator, conditions

# What the suite waits on, from the test bed (the benches wait on it too).
from testbed.operator import ready as ready
from testbed.tools import ROOT, Kubectl, eventually

from cpullm.core.children.common import SERVICE_LABEL

# From e2e/test_operator.py.


def not_planned(kubectl: Kubectl, namespace: str, name: str, reason: str) -> dict[str, Any]:
    def probe() -> dict[str, Any]:
        service = kubectl.get("cpullm", name, namespace)
        cond = conditions(service)
        assert cond.get("Planned", {}).get("reason") == reason, cond
        assert cond["Ready"]["status"] == "False", cond
        return service

    return eventually(probe, timeout=60, what=f"{namespace}/{name} refused with {reason}")


def events(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    """The events about the CpuLLMService `name` (not its Deployment of the same name, whose controller's events
    come through the events.k8s.io API without a count)."""
    about = {"kind": "CpuLLMService", "name": name}
    return [
        e for e in kubectl.get("events", namespace=namespace) if {k: e["involvedObject"].get(k) for k in about} == about
    ]


def container(deploy: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = deploy["spec"]["template"]["spec"]["containers"][0]
    return result


# From e2e/conftest.py.


def node_ready(kubectl: Kubectl, name: str) -> bool:
    node = kubectl.get("node", name)
    conditions = {c["type"]: c["status"] for c in (node or {}).get("status", {}).get("conditions", [])}
    return conditions.get("Ready") == "True"


class NodePool:
    """KWOK nodes made for one test; deleted after it."""

    def __init__(self, kubectl: Kubectl) -> None:
        self.kubectl = kubectl
        self.names: set[str] = set()

    def add(self, node: dict[str, Any]) -> None:
        self.kubectl.apply(node)
        self.names.add(node["metadata"]["name"])
        eventually(lambda: node_ready(self.kubectl, node["metadata"]["name"]), timeout=60, what="node Ready")


# From e2e/test_faults.py.

# After a fault ends, the time every service gets to agree with its children again: the operator's transient
# retry is a few seconds (controller/outcomes.py's TRANSIENT_RETRY_SECONDS, jittered) and a watch resumes at once.
SETTLE_SECONDS = 90


def pool(nodes: NodePool, namespace: str, count: int = 2) -> dict[str, str]:
    """Big one-NUMA nodes only this test's services select (TP=1, 3 CPUs each: ~85 services per node)."""
    for i in range(count):
        nodes.add(fake_node(f"pool-{i}-{namespace[-5:]}", numa=1, cpu="256", memory="2Ti", pool=namespace))
    return {"pool": namespace}


def create(kubectl: Kubectl, namespace: str, prefix: str, count: int, selector: dict[str, str]) -> list[str]:
    names = [f"{prefix}-{i}" for i in range(count)]
    for start in range(0, count, 50):  # one kubectl call per 50: each stays well within its timeout
        kubectl.apply(*(tiny_service(n, namespace, nodeSelector=selector) for n in names[start : start + 50]))
    return names


# A pod bound this long and still not started was missed by KWOK, the fake kubelet (its fast stages start a pod
# within a second): seen twice in ~8 runs after an etcd restart, that pod left Pending for good.
MISSED_BY_KWOK_SECONDS = 30


def settled(service: dict[str, Any]) -> bool:
    status = service.get("status", {})
    return (
        conditions(service).get("Ready", {}).get("status") == "True"
        and status.get("observedGeneration") == service["metadata"]["generation"]
        and status.get("readyReplicas") == service["spec"].get("replicas", 1)
    )


def missed_by_kwok(pods: list[dict[str, Any]], now: datetime) -> bool:
    """Every pod bound to a node MISSED_BY_KWOK_SECONDS ago or more and never started (not the operator's doing)."""

    def bound_since(pod: dict[str, Any]) -> datetime | None:
        for condition in pod["status"].get("conditions", []):
            if condition["type"] == "PodScheduled" and condition["status"] == "True":
                return datetime.fromisoformat(condition["lastTransitionTime"])
        return None

    since = [bound_since(p) for p in pods if p["status"].get("phase") == "Pending"]
    return (
        bool(pods)
        and len(since) == len(pods)
        and all(s is not None and (now - s).total_seconds() >= MISSED_BY_KWOK_SECONDS for s in since)
    )


def missed_by_kwok_and_reported(
    kubectl: Kubectl, namespace: str, services: dict[str, dict[str, Any]], stale: list[str]
) -> list[str]:
    """The stale services settled all the same: KWOK never started their pods, and they say so (Ready=False)."""
    deployments = {d["metadata"]["name"]: d for d in kubectl.get("deployments", namespace=namespace)}
    pods: dict[str, list[dict[str, Any]]] = {}
    for pod in kubectl.get("pods", namespace=namespace):
        pods.setdefault(pod["metadata"]["labels"].get(SERVICE_LABEL, ""), []).append(pod)
    now = datetime.now(UTC)
    missed = [
        name
        for name in stale
        if missed_by_kwok(pods.get(name, []), now) and reports_its_deployment(services[name], deployments.get(name))
    ]
    if missed:
        print(f"left Pending by KWOK, reported as not ready: {missed}")
    return missed


def reports_its_deployment(service: dict[str, Any], deployment: dict[str, Any] | None) -> bool:
    """The service's status describes its Deployment as it is: generation, ready pods, and Ready=False."""
    status = service.get("status", {})
    ready = (deployment or {}).get("status", {}).get("readyReplicas", 0)
    return (
        deployment is not None
        and status.get("observedGeneration") == service["metadata"]["generation"]
        and status.get("readyReplicas") == ready < service["spec"].get("replicas", 1)
        and conditions(service).get("Ready", {}).get("status") == "False"
    )


class LogMark:
    """What the operator logged since the mark."""

    def __init__(self, operator: Operator) -> None:
        self.operator, self.offset = operator, operator.log_path.stat().st_size

    def text(self) -> str:
        with self.operator.log_path.open("rb") as log:
            log.seek(self.offset)
            return log.read().decode(errors="replace")

    def assert_quiet(self) -> None:
        text = self.text()
        assert "Traceback" not in text, text[text.index("Traceback") - 2000 :][:6000]


def converged(
    kubectl: Kubectl,
    namespace: str,
    names: list[str],
    timeout: float = SETTLE_SECONDS,
    log: LogMark | None = None,
    one_replica_set: bool = True,
) -> float:
    """Waits until every service is Ready for its generation with its replicas ready (or truly reports a pod KWOK
    never started: missed_by_kwok_and_reported), then checks each has exactly one Deployment, Service and
    ReplicaSet (`one_replica_set=False`: a Deployment created again may adopt its predecessor's ReplicaSet before
    the garbage collector removed it, and keep it as history at 0 replicas). All of it is awaited together: a
    status already settled (a child deleted, another operator started, no spec change) may predate the reconcile
    that is still writing the children. Returns the seconds it took."""
    start = time.monotonic()

    def probe() -> bool:
        services = {s["metadata"]["name"]: s for s in kubectl.get("cpullm", namespace=namespace)}
        assert sorted(services) == sorted(names), sorted(services)
        stale = sorted(name for name, service in services.items() if not settled(service))
        if stale:
            missed = missed_by_kwok_and_reported(kubectl, namespace, services, stale)
            stale = [name for name in stale if name not in missed]
        assert not stale, f"{len(stale)} not settled, e.g. {stale[0]}: {services[stale[0]].get('status')}"
        deployments = {d["metadata"]["name"]: d for d in kubectl.get("deployments", namespace=namespace)}
        assert sorted(deployments) == sorted(names), ("deployments", sorted(deployments))
        found = sorted(o["metadata"]["name"] for o in kubectl.get("services", namespace=namespace))
        assert found == sorted(names), ("services", found)
        for name, service in services.items():  # the status agrees with the child it describes
            child = deployments[name]["status"]
            assert child.get("readyReplicas", 0) == service["status"]["readyReplicas"], (child, service["status"])
        replica_sets = kubectl.get("replicasets", namespace=namespace)
        scaled_up = [rs["metadata"]["name"] for rs in replica_sets if rs["spec"].get("replicas")]
        assert len(scaled_up) == len(names), scaled_up
        if one_replica_set:
            assert len(replica_sets) == len(names), [rs["metadata"]["name"] for rs in replica_sets]
        return True

    try:
        eventually(probe, timeout=timeout, interval=1, what=f"{len(names)} services settled")
    except AssertionError as err:
        if log is not None and ", e.g. " in str(err):  # what the operator did about the first one left behind
            stale = str(err).split(", e.g. ", 1)[-1].split(":", 1)[0]
            lines = [line for line in log.text().splitlines() if f"/{stale} " in line or f"/{stale}:" in line]
            raise AssertionError(f"{err}\noperator log about {stale}:\n" + "\n".join(lines[-40:])) from err
        raise
    return time.monotonic() - start


# From e2e/test_monitoring.py.


def install(kubectl: Kubectl, path: str, name: str) -> None:
    kubectl.run("apply", "--server-side", "-f", path)
    kubectl.wait_established(name)


def condition(kubectl: Kubectl, namespace: str, name: str, type_: str, status: str, reason: str) -> dict[str, Any]:
    def probe() -> dict[str, Any]:
        found = conditions(kubectl.get("cpullm", name, namespace)).get(type_, {})
        assert (found.get("status"), found.get("reason")) == (status, reason), found
        return found

    return eventually(probe, timeout=60, what=f"{type_}={status} {reason}")


def owned_by_service(obj: dict[str, Any], name: str) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return [(r["kind"], r["name"], r.get("controller")) for r in refs] == [("CpuLLMService", name, True)]


# From e2e/test_chart.py.

CHART = ROOT / "charts" / "cpullm-operator"


RELEASE = "cpullm"


RELEASE_NAMESPACE = "cpullm-system"


# The chart's values for the operator's image as these tests install it: a local build, never pulled (the chart
# refuses its default image otherwise, which no registry serves).
LOCAL_IMAGE = ("--set", "image.pullPolicy=Never")


class Helm:
    def __init__(self, binary: Path, kubeconfig: str) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), "--kubeconfig", self.kubeconfig, *args], capture_output=True, text=True, timeout=300
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def template(self, *values: str) -> str:
        return self.run("template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, *LOCAL_IMAGE, *values).stdout


def probe_values(node: str, image: str, seconds_per_point: float) -> tuple[str, ...]:
    """Helm arguments for the chart's probe Job on `node`, in the vLLM image `image`, quickly (the figures of a
    short measurement are rougher; the tests check where they go, not what they are)."""
    return (
        *("--set-string", f"probe.nodes[0].name={node},probe.nodes[0].image={image}"),
        *("--set-json", f"probe.secondsPerPoint={seconds_per_point}"),  # --set reads 0.2 as a string
    )


def probe_measured(kubectl: Kubectl, namespace: str, node: str, timeout: float) -> dict[str, Any]:
    """Waits for the chart's probe Job of `node` to finish; its NodePerformance as published. A failed Job fails
    the test with its containers' logs."""

    def finished() -> dict[str, Any] | None:
        jobs = kubectl.get("jobs", namespace=namespace, **{"app.kubernetes.io/component": "probe"})
        (job,) = [j for j in jobs if j["metadata"].get("annotations", {}).get("cpullm.io/probed-node") == node]
        states = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}
        if states.get("Failed") == "True":
            logs = kubectl.run(
                "logs", f"job/{job['metadata']['name']}", "-n", namespace, "--all-containers", check=False
            )
            raise RuntimeError(f"the probe Job of {node} failed:\n{logs.stdout[-3000:]}{logs.stderr[-1000:]}")
        return job if states.get("Complete") == "True" else None

    eventually(finished, timeout=timeout, interval=2, what=f"the probe Job of {node} complete")
    published: dict[str, Any] = kubectl.get("nodeperformance", node)
    return published
