"""An upgrade of the operator itself on the local control plane (KWOK nodes: enough to count what changes): the
previous version's operator (its source from git, run as a process like the suite's) serves 50 services; then the
CRD is applied and the operator replaced by this tree's, as docs/releasing.md tells a user to upgrade; every server
whose plan did not change must keep its pod template, since a changed template restarts that server (a CPU server
takes minutes to come back: an upgrade that changed them all would be a fleet-wide outage), unless the in-pod files
it runs changed (a fix to them reaches the servers that way, paced). Then a restart of the new operator must write
nothing at all. A downgrade is the same the other way round, and must hold the same. Where templates must change (an
admin setting here), at most rollouts.maxConcurrent services roll at once.

The previous version is CPULLM_UPGRADE_FROM (a git revision), else the newest `v*` tag behind HEAD, else HEAD's
parent: before the first release, each commit is checked against the one before it. Marker local_operator: it stops
the suite's operator for its duration and runs the two versions itself."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed.operator import Operator
from testbed.tools import ROOT, Kubectl, eventually, free_port

from cpullm.core.children.launcher import IN_POD_CODE
from e2e.support import LogMark, NodePool, converged, create, pool

pytestmark = pytest.mark.local_operator
SERVICES = 50
QUIET_SECONDS = 15  # no object of the namespace changed for this long: the operator is done


def previous_revision() -> str:
    if os.environ.get("CPULLM_UPGRADE_FROM"):
        return os.environ["CPULLM_UPGRADE_FROM"]
    git = ["git", "-C", str(ROOT)]
    tag = subprocess.run(
        [*git, "describe", "--tags", "--abbrev=0", "--match", "v*", "HEAD"], capture_output=True, text=True
    )
    return tag.stdout.strip() if tag.returncode == 0 else "HEAD~1"


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The previous version's tree, a detached git worktree (removed afterwards)."""
    revision = previous_revision()
    known = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"])
    if known.returncode != 0:
        pytest.skip(f"the previous version, {revision}, is not in this clone's history (a shallow clone?)")
    path = tmp_path_factory.mktemp("previous") / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), revision], check=True, capture_output=True
    )
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


def operator_of(tree: Path, kubectl: Kubectl, log: Path, namespace: str) -> Operator:
    """`cpullm run` of `tree`'s source (PYTHONPATH ahead of this tree's editable install), watching `namespace`."""
    env = {"PYTHONPATH": str(tree / "operator")}
    return Operator(kubectl.kubeconfig, log, free_port(), ["--namespace", namespace], env=env)


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def snapshot(kubectl: Kubectl, namespace: str) -> dict[str, dict[str, Any]]:
    """Per service: its Deployment's pod template (digest) and every object's resourceVersion (a write changes it)."""
    seen: dict[str, dict[str, Any]] = {}
    for kind in ("cpullm", "deployments", "services", "configmaps", "networkpolicies"):
        for item in kubectl.get(kind, namespace=namespace):
            name = item["metadata"]["name"]
            seen.setdefault(name, {})[f"{kind}/resourceVersion"] = item["metadata"]["resourceVersion"]
            if kind == "deployments":
                seen[name]["template"] = digest(item["spec"]["template"])
                # The in-pod files' digest: a change of them rolls the servers by design (core/children/launcher.py).
                annotations = item["spec"]["template"]["metadata"].get("annotations") or {}
                seen[name]["in-pod code"] = annotations.get(IN_POD_CODE)
            if kind == "cpullm":
                seen[name]["plan"] = item.get("status", {}).get("plan")
    return seen


def quiet(kubectl: Kubectl, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's snapshot once nothing in it changed for QUIET_SECONDS."""
    last = {"snapshot": snapshot(kubectl, namespace), "since": time.monotonic()}

    def unchanged() -> dict[str, dict[str, Any]] | None:
        now = snapshot(kubectl, namespace)
        if now != last["snapshot"]:
            last.update(snapshot=now, since=time.monotonic())
            return None
        return now if time.monotonic() - last["since"] >= QUIET_SECONDS else None

    return eventually(unchanged, timeout=300, interval=2, what=f"{namespace} quiet for {QUIET_SECONDS}s")


def replanned_between(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether a field both versions plan differs (a field one of them does not know is not a change of plan)."""
    return any(before[key] != after[key] for key in before.keys() & after.keys())


def crd_file(tree: Path) -> Path:
    return tree / "crds" / "cpullm.io_cpullmservices.yaml"


@pytest.mark.parametrize("direction", ["upgrade", "downgrade"])
def test_an_upgrade_or_downgrade_changes_no_servers_template_unless_its_plan_changed_and_a_restart_writes_nothing(
    kubectl: Kubectl,
    operator: Operator,
    nodes: NodePool,
    namespace: str,
    previous_tree: Path,
    workdir: Path,
    direction: str,
) -> None:
    """An upgrade: the previous version, then this tree. A downgrade: this tree, then the previous version (the
    CRD of the version that runs applied first either way, as docs/releasing.md tells a user). Between an upgrade's
    two steps the previous operator runs against the new CRD: it must plan every spec as before."""
    operator.stop()  # the suite's, watching every namespace: here the two versions run alone
    trees = (previous_tree, ROOT) if direction == "upgrade" else (ROOT, previous_tree)
    logs = (workdir / f"{direction}-first.log", workdir / f"{direction}-then.log")
    first, then = (operator_of(tree, kubectl, log, namespace) for tree, log in zip(trees, logs, strict=True))
    try:
        kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(crd_file(trees[0])))
        first.start()
        names = create(kubectl, namespace, "fleet", SERVICES, pool(nodes, namespace))
        converged(kubectl, namespace, names, timeout=300)
        before = quiet(kubectl, namespace)
        if direction == "upgrade":
            # docs/releasing.md's order: the new CRD first, while the previous operator still runs. A reconcile of
            # each service (a child changed by another writer: its launcher ConfigMap annotated) reads its spec as
            # the API server shows it now, the new CRD's defaults and all: none may be refused for a field the
            # previous version does not know.
            kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(crd_file(trees[1])))
            touched = ("configmaps", "-n", namespace, "-l", "app.kubernetes.io/managed-by=cpullm-operator")
            kubectl.run("annotate", *touched, "--overwrite", "cpullm.io/e2e-window=crd")
            quiet(kubectl, namespace)
            refused = {
                s["metadata"]["name"]: c["message"]
                for s in kubectl.get("cpullm", namespace=namespace)
                for c in s.get("status", {}).get("conditions", [])
                if c["type"] == "Planned" and c["reason"] == "InvalidSpec"
            }
            assert not refused, f"the previous operator refused specs under the new CRD: {list(refused.items())[:3]}"
        first.stop()

        started = time.monotonic()
        kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(crd_file(trees[1])))
        served = kubectl.get("crd", "cpullmservices.cpullm.io")["spec"]["versions"]
        applied = yaml.safe_load(crd_file(trees[1]).read_text())["spec"]["versions"]
        assert [v["schema"] for v in served] == [v["schema"] for v in applied]
        then.log_path.touch()
        log = LogMark(then)
        then.start()
        converged(kubectl, namespace, names, timeout=300, one_replica_set=False)  # a changed template: two each
        after = quiet(kubectl, namespace)
        took = time.monotonic() - started
        changed = sorted(n for n in names if after[n]["template"] != before[n]["template"])
        replanned = sorted(n for n in names if replanned_between(before[n]["plan"], after[n]["plan"]))
        recoded = sorted(n for n in names if before[n].get("in-pod code") != after[n].get("in-pod code"))
        print(
            f"{direction} {'from' if direction == 'upgrade' else 'to'} {previous_revision()}: {len(changed)} of "
            f"{SERVICES} pod templates changed, {len(replanned)} plans changed, {len(recoded)} servers' in-pod code "
            f"changed; settled in {took:.0f}s (with {QUIET_SECONDS}s of quiet)"
        )
        unexplained = set(changed) - set(replanned) - set(recoded)
        assert not unexplained, (
            f"templates changed with their plans and in-pod code unchanged: {sorted(unexplained)[:5]}"
        )
        log.assert_quiet()

        # A restart with nothing new: not one write.
        then.stop()
        then.start()
        again = quiet(kubectl, namespace)
        assert again == after, [n for n in names if again[n] != after[n]][:5]
        log.assert_quiet()
    finally:
        first.stop()
        then.stop()
        operator.start()


PACED_LIMIT = 5
PACED_IMAGE = "registry.example/vllm-cpu:paced"  # never pulled: KWOK's pods run no container


class RollingWatch:
    """Every Deployment of the namespace as a watch streams it (`kubectl get -w`), and the most of them mid-rollout
    at any one event: a new template not yet observed by its controller, or not every replica updated and
    available with no old one left (what `kubectl rollout status` waits for). A poll could miss a peak."""

    def __init__(self, kubectl: Kubectl, namespace: str) -> None:
        args = [kubectl.binary, "--kubeconfig", kubectl.kubeconfig, "get", "deployments", "-n", namespace]
        self.process = subprocess.Popen([*args, "-w", "-o", "json"], stdout=subprocess.PIPE, text=True)
        self.latest: dict[str, dict[str, Any]] = {}
        self.peak = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    @staticmethod
    def rolling(deployment: dict[str, Any]) -> bool:
        spec, status = deployment["spec"], deployment.get("status", {})
        want = spec.get("replicas", 1)
        return (
            status.get("observedGeneration", 0) < deployment["metadata"]["generation"]
            or status.get("updatedReplicas", 0) < want
            or status.get("availableReplicas", 0) < want
            or status.get("replicas", 0) > status.get("updatedReplicas", 0)
        )

    def _read(self) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            buffer += line
            try:
                deployment, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                continue
            buffer = buffer.lstrip()[end:]
            self.latest[deployment["metadata"]["name"]] = deployment
            self.peak = max(self.peak, sum(map(self.rolling, list(self.latest.values()))))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.thread.join(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()


def test_a_template_change_no_spec_asked_for_rolls_out_at_most_k_services_at_once(
    kubectl: Kubectl, operator: Operator, nodes: NodePool, namespace: str, workdir: Path
) -> None:
    """An admin setting that changes every server's template (the vLLM image) reaches all 50 services at once;
    the operator rolls at most rollouts.maxConcurrent of them at a time, the others wait with RolloutPaced."""
    operator.stop()
    images = json.dumps({"amd64": PACED_IMAGE, "arm64": PACED_IMAGE})
    before = operator_of(ROOT, kubectl, workdir / "paced-before.log", namespace)
    paced = Operator(
        kubectl.kubeconfig,
        workdir / "paced.log",
        free_port(),
        ["--namespace", namespace],
        env={"CPULLM_VLLM_IMAGES": images, "CPULLM_MAX_CONCURRENT_ROLLOUTS": str(PACED_LIMIT)},
    )
    watch: RollingWatch | None = None
    try:
        before.start()
        names = create(kubectl, namespace, "paced", SERVICES, pool(nodes, namespace))
        converged(kubectl, namespace, names, timeout=300)
        before.stop()

        watch = RollingWatch(kubectl, namespace)
        eventually(lambda: len(watch.latest) == SERVICES, timeout=30, what="the watch lists every Deployment")
        paced_seen: set[str] = set()

        def rolled_out() -> bool:
            for service in kubectl.get("cpullm", namespace=namespace):
                if any(c["type"] == "RolloutPaced" for c in service.get("status", {}).get("conditions", [])):
                    paced_seen.add(service["metadata"]["name"])
            deployments = list(watch.latest.values())
            images = [d["spec"]["template"]["spec"]["containers"][0]["image"] for d in deployments]
            return images.count(PACED_IMAGE) == SERVICES and not any(map(watch.rolling, deployments))

        started = time.monotonic()
        paced.start()
        eventually(rolled_out, timeout=600, interval=1, what=f"{SERVICES} servers on {PACED_IMAGE}")
        took = time.monotonic() - started
        converged(kubectl, namespace, names, timeout=120, one_replica_set=False)
        print(
            f"{SERVICES} template changes with rollouts.maxConcurrent={PACED_LIMIT}: at most {watch.peak} rolling at "
            f"once, {len(paced_seen)} services seen waiting (RolloutPaced), all rolled out in {took:.0f}s"
        )
        assert 2 <= watch.peak <= PACED_LIMIT
        assert paced_seen, "no service was seen waiting for a rollout slot"
        assert not any(
            c["type"] == "RolloutPaced"
            for s in kubectl.get("cpullm", namespace=namespace)
            for c in s.get("status", {}).get("conditions", [])
        )
    finally:
        if watch is not None:
            watch.stop()
        before.stop()
        paced.stop()
        operator.start()
