"""The promise that offline output and the operator's can never disagree: `cpullm render` and `cpullm plan`
on an example print exactly what a Reconciler, fed the same service object and the same nodes, applies and
writes into status.plan."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from cpullm.controller.reconcile import Reconciler
from cpullm.core.observation import ClusterView
from cpullm.io.files import load_nodes

from .support import EXAMPLES, NODES, TOKEN, ConfigHub, RecordingKube, cli


def prepared(example: Path, tmp_path: Path, inline: bool) -> tuple[dict[str, Any], list[str]]:
    """The example with a uid (so owner references appear), written to a file, and the CLI's extra flags.
    With inline=False its config moves to a config.json given by --model-config (and to the stub Hub)."""
    service = yaml.safe_load(example.read_text())
    service["metadata"]["uid"] = f"uid-{example.stem}"
    flags: list[str] = []
    if not inline:
        config = service["spec"]["model"].pop("config")
        (tmp_path / "config.json").write_text(json.dumps(config))
        flags = ["--model-config", str(tmp_path / "config.json")]
    (tmp_path / "service.yaml").write_text(yaml.safe_dump(service, sort_keys=False))
    return service, flags


CASES = [pytest.param(e, True, id=f"{e.stem}-inline") for e in EXAMPLES] + [
    pytest.param(e, False, id=f"{e.stem}-model-config") for e in EXAMPLES
]


@pytest.mark.parametrize(("example", "inline"), CASES)
def test_render_and_plan_equal_what_the_reconciler_applies_and_reports(example, inline, tmp_path, capsys, monkeypatch):
    """Both sides go through gather and decide; any divergence (defaults, uid, sizing source) shows here."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("CPULLM_HF_TOKEN", raising=False)
    service, flags = prepared(example, tmp_path, inline)
    path = str(tmp_path / "service.yaml")
    rendered = cli(capsys, "render", path, "--nodes", NODES, "-o", "json", *flags)
    printed_plan = cli(capsys, "plan", path, "--nodes", NODES, "-o", "json", *flags)

    kube = RecordingKube()
    hub = ConfigHub(None if inline else json.loads((tmp_path / "config.json").read_text()))
    reconciler = Reconciler(kube, hub, clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    nodes = load_nodes(NODES, pytest.fail)
    outcome = reconciler.reconcile(service, ClusterView(nodes=nodes))

    assert outcome is not None and not isinstance(outcome, Exception), outcome
    assert kube.applied == rendered["items"]
    (patch,) = kube.status_patches
    assert patch["plan"] == printed_plan
    assert outcome.model_dump(by_alias=True, mode="json", exclude_none=True) == printed_plan

    uid = service["metadata"]["uid"]
    owners = {ref["uid"] for obj in kube.applied for ref in obj["metadata"]["ownerReferences"]}
    assert owners == {uid}
    assert {"Deployment", "Service"} <= {obj["kind"] for obj in kube.applied}

    secret = service["spec"].get("hfTokenSecret")
    if inline:
        assert (hub.calls, kube.secret_reads) == ([], [])  # an inline config needs neither Hub nor secret
    else:
        name, revision = service["spec"]["model"]["name"], service["spec"]["model"].get("revision")
        assert hub.calls == [(name, revision, TOKEN if secret else None)]
