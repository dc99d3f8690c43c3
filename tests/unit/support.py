"""What the unit tests share beyond the object builders (builders.py): the repository's paths and sample nodes, the
stubs the reconciler talks to, the CLI run in-process, the offline-equals-operator harness, and one Observed
builder. Test modules import from here, never from each other (pyproject.toml's import contracts)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from cpullm.api.spec import parse_spec
from cpullm.cli import main
from cpullm.controller.reconcile import Reconciler
from cpullm.controller.state import ControllerState
from cpullm.controller.workers import ReconcileWorkers
from cpullm.core.children.common import Owner
from cpullm.core.observation import ClusterView, NamespaceFacts, Observed, Ownership
from cpullm.core.planner import plan_service
from cpullm.core.sizing import ModelFiles, size_model
from cpullm.errors import ChildExists, ModelConfigUnavailable
from cpullm.io.files import load_nodes
from cpullm.settings import Settings

from .builders import LLAMA_8B, llama_8b, node, spec

# The node an Observed is planned on unless a test says otherwise: one 2-NUMA node.
PLANNED_NODES = (node("n1", numa=2, memory="512Gi"),)

ROOT = Path(__file__).resolve().parents[2]


NODES = str(ROOT / "examples" / "nodes.yaml")


EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


TOKEN = "hf_offline_test"


class RecordingKube:
    """The API as the reconciler sees it: every secret holds TOKEN; applies and status patches are recorded, and
    in `calls` the applies, deletes and events in their order."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.status_patches: list[dict[str, Any]] = []
        self.secret_reads: list[tuple[str, str, str]] = []
        self.calls: list[tuple[str, ...]] = []

    def read_namespace(self, namespace: str) -> NamespaceFacts:
        return NamespaceFacts()

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        self.secret_reads.append((namespace, name, key))
        return TOKEN

    def apply(self, manifest: dict[str, Any], over: Any) -> dict[str, Any]:
        self.applied.append(manifest)
        self.calls.append(("apply", manifest["apiVersion"], manifest["kind"]))
        return manifest

    def delete(self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str) -> None:
        self.calls.append(("delete", api_version, kind, namespace, name))

    def ownership(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        return None

    def patch_service_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status_patches.append(dict(status))

    def emit_event(self, regarding: Any, type_: str, reason: str, message: str) -> None:
        self.calls.append(("event", type_, reason))


class ConfigHub:
    """A Hub that answers every model with one config.json, and records who asked with which token."""

    def __init__(self, config: dict[str, Any] | None) -> None:
        self.config = config
        self.calls: list[tuple[str, str | None, str | None]] = []

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        self.calls.append((name, revision, token))
        if self.config is None:
            raise AssertionError(f"the Hub was asked for {name} although the spec has an inline config")
        return ModelFiles(config=self.config, checkpoint_total_bytes=None)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(list(args)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def offline_and_operator(
    service: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[list[dict[str, Any]], dict[str, Any], RecordingKube]:
    """One service on the sample nodes with the settings of the environment, both ways: what `cpullm render` and
    `cpullm plan` print, and the RecordingKube of the operator's reconcile (constructed from Settings, as
    handlers.configure does)."""
    path = tmp_path / "service.yaml"
    path.write_text(yaml.safe_dump(service))
    rendered = cli(capsys, "render", str(path), "--nodes", NODES, "-o", "json")["items"]
    plan = cli(capsys, "plan", str(path), "--nodes", NODES, "-o", "json")
    settings, kube = Settings(), RecordingKube()
    reconciler = Reconciler(
        kube,
        ConfigHub(None),
        clock=lambda: datetime(2026, 1, 1, tzinfo=UTC),
        policy=settings.policy(),
    )
    reconciler.reconcile(service, ClusterView(nodes=load_nodes(NODES, pytest.fail)))
    return rendered, plan, kube


def direct_plan(example: Path, current: dict | None = None) -> dict:
    """The plan computed without the CLI: the planner on the parsed spec, the sized model and parsed nodes;
    `current`: the plan the service runs (status.plan)."""
    spec = parse_spec(yaml.safe_load(example.read_text())["spec"])
    assert spec.model.config is not None  # every example sizes from its inline config
    model = size_model(spec.model.config, spec.model.dtype, weights_bytes=spec.model.weights_bytes)
    plan = plan_service(spec, model, load_nodes(NODES, pytest.fail), current)
    return plan.model_dump(by_alias=True, mode="json", exclude_none=True)


class StubKube:
    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.status_patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.secrets = {("serving", "hf", "HF_TOKEN"): "hf_secret"}
        self.namespace_labels: dict[str, str] = {}
        self.terminating = False
        self.present: set[tuple[str, str]] = set()  # what list_owned finds, of any kind
        self.changed: set[tuple[str, str]] = set()  # of those, what another writer changed
        self.unlisted: set[tuple[str, str]] = set()  # what exists though list_owned misses it
        self.reads: list[tuple[str, str, str]] = []
        self.owners: dict[tuple[str, str, str], Ownership] = {}  # objects that exist, by kind, namespace, name
        self.ownership_reads: list[tuple[str, str, str]] = []  # the reads of a child's owner
        self.applied_over: list[Ownership | None] = []  # what each apply was told the child is

    def list_owned(self, kind, namespaces):
        """Markers as applied (this stub stores what it is given: no uid, no generation) unless changed."""
        return {key: "other/2" if key in self.changed else "None/None" for key in self.present}

    def child_exists(self, kind, namespace, name):
        self.reads.append((kind, namespace, name))
        return (namespace, name) in self.present | self.unlisted

    def apply(self, manifest, over):
        """As the API server: an apply over nothing known (a create) is refused where the object exists."""
        meta = manifest["metadata"]
        if over is None and (manifest["kind"], meta["namespace"], meta["name"]) in self.owners:
            raise ChildExists(f"cannot apply {manifest['kind']} {meta['namespace']}/{meta['name']}: it exists")
        self.applied.append(manifest)
        self.applied_over.append(over)
        return manifest

    def ownership(self, api_version, kind, namespace, name):
        self.ownership_reads.append((kind, namespace, name))
        return self.owners.get((kind, namespace, name))

    def read_namespace(self, namespace):
        return NamespaceFacts(labels=self.namespace_labels, terminating=self.terminating)

    def patch_service_status(self, namespace, name, status):
        self.status_patches.append(dict(status))

    def read_secret_key(self, namespace, name, key):
        return self.secrets.get((namespace, name, key))

    def emit_event(self, regarding, type_, reason, message):
        self.events.append((type_, reason))


def state_of(reconciler: Reconciler) -> ControllerState:
    """The controller's state around a reconciler, sharing its memory and pacer as the operator's does."""
    return ControllerState(reconciler, ReconcileWorkers(1), reconciler.memory, reconciler.pacer, reconciler.kube)


class StubHub:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[str, str | None, str | None]] = []

    def fetch(self, name, revision, token):
        self.calls.append((name, revision, token))
        if self.fail:
            raise ModelConfigUnavailable("cannot reach the hub")
        return ModelFiles(config=LLAMA_8B, checkpoint_total_bytes=None)


def service(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": "serving", "uid": "u1", "generation": 2},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B"}, "kvCacheGiB": 4, "maxModelLen": 8192, **spec},
        "status": status or {},
    }


T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


OWNER = Owner(name="llama", namespace="serving", uid="u1")


def observed(**fields: Any) -> Observed:
    """A service that plans (TP 2 on one 2-NUMA node) unless the test says otherwise."""
    base: dict[str, Any] = {
        "owner": OWNER,
        "generation": 3,
        "spec": spec(),
        "requested_replicas": 1,
        "model": llama_8b(),
        "nodes": PLANNED_NODES,
    }
    return Observed(**{**base, **fields})
