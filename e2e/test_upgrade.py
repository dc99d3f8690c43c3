"""An upgrade of the operator itself on the local control plane (KWOK nodes: enough to count what changes): the
previous version's operator (its source from git, run as a process like the suite's) serves 50 services; then the
CRD is applied and the operator replaced by this tree's, as docs/releasing.md tells a user to upgrade; every server
whose plan did not change must keep its pod template, since a changed template restarts that server (a CPU server
takes minutes to come back: an upgrade that changed them all would be a fleet-wide outage). Then a restart of the
new operator must write nothing at all.

The previous version is CPULLM_UPGRADE_FROM (a git revision), else the newest `v*` tag behind HEAD, else HEAD's
parent: before the first release, each commit is checked against the one before it. Marker local_operator: it stops
the suite's operator for its duration and runs the two versions itself."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed.tools import ROOT, Kubectl, eventually, free_port

from e2e.conftest import NodePool
from e2e.helpers import Operator
from e2e.test_faults import LogMark, converged, create, pool

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


def test_an_upgrade_changes_no_servers_template_unless_its_plan_changed_and_a_restart_writes_nothing(
    kubectl: Kubectl, operator: Operator, nodes: NodePool, namespace: str, previous_tree: Path, workdir: Path
) -> None:
    operator.stop()  # the suite's, watching every namespace: here the two versions run alone
    old = operator_of(previous_tree, kubectl, workdir / "upgrade-previous.log", namespace)
    new = operator_of(ROOT, kubectl, workdir / "upgrade-current.log", namespace)
    try:
        kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(crd_file(previous_tree)))
        old.start()
        names = create(kubectl, namespace, "fleet", SERVICES, pool(nodes, namespace))
        converged(kubectl, namespace, names, timeout=300)
        before = quiet(kubectl, namespace)
        old.stop()

        # The upgrade as docs/releasing.md has it: the CRD first, then the operator.
        started = time.monotonic()
        kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(crd_file(ROOT)))
        served = kubectl.get("crd", "cpullmservices.cpullm.io")["spec"]["versions"]
        applied = yaml.safe_load(crd_file(ROOT).read_text())["spec"]["versions"]
        assert [v["schema"] for v in served] == [v["schema"] for v in applied]
        new.log_path.touch()
        log = LogMark(new)
        new.start()
        converged(kubectl, namespace, names, timeout=300, one_replica_set=False)  # a changed template: two each
        after = quiet(kubectl, namespace)
        took = time.monotonic() - started
        changed = sorted(n for n in names if after[n]["template"] != before[n]["template"])
        replanned = sorted(n for n in names if replanned_between(before[n]["plan"], after[n]["plan"]))
        print(
            f"upgrade from {previous_revision()}: {len(changed)} of {SERVICES} pod templates changed, {len(replanned)} "
            f"plans changed; settled in {took:.0f}s (with {QUIET_SECONDS}s of quiet)"
        )
        assert set(changed) <= set(replanned), f"templates changed with their plans unchanged: {changed[:5]}"
        log.assert_quiet()

        # A restart with nothing new: not one write.
        new.stop()
        new.start()
        again = quiet(kubectl, namespace)
        assert again == after, [n for n in names if again[n] != after[n]][:5]
        log.assert_quiet()
    finally:
        old.stop()
        new.stop()
        operator.start()
