"""The servers' vLLM image: spec.image, else the operator's for the nodes' arch (settings.vllm_images, the chart's
vllm.images), else vLLM's published one; offline and in the operator alike, and unchanged for whoever sets none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cpullm.core.planner import plan_service

from .builders import llama_8b, node, spec
from .support import EXAMPLES, NODES, ROOT, cli, offline_and_operator

PUBLISHED = {
    "amd64": "docker.io/vllm/vllm-openai-cpu:v0.32.0-x86_64",
    "arm64": "docker.io/vllm/vllm-openai-cpu:v0.32.0-arm64",
}
PINNED = {arch: f"registry.corp/vllm-{arch}@sha256:" + "ab" * 32 for arch in ("amd64", "arm64")}


@pytest.fixture(autouse=True)
def no_admin_images(monkeypatch):
    """The machine's environment must not choose the images these tests expect."""
    monkeypatch.delenv("CPULLM_VLLM_IMAGES", raising=False)


@pytest.mark.parametrize(
    ("asked", "admins", "arch", "image"),
    [
        pytest.param(None, {}, "amd64", PUBLISHED["amd64"], id="none-set-published-amd64"),
        pytest.param(None, {}, "arm64", PUBLISHED["arm64"], id="none-set-published-arm64"),
        pytest.param(None, PINNED, "amd64", PINNED["amd64"], id="the-admins-amd64"),
        pytest.param(None, PINNED, "arm64", PINNED["arm64"], id="the-admins-arm64"),
        pytest.param(None, {"amd64": PINNED["amd64"]}, "arm64", PUBLISHED["arm64"], id="another-arch-set-published"),
        pytest.param("me/vllm:1", PINNED, "amd64", "me/vllm:1", id="the-specs-own-wins"),
    ],
)
def test_the_specs_image_else_the_admins_for_the_arch_else_the_published(asked, admins, arch, image):
    service_spec = spec(image=asked) if asked else spec()
    plan = plan_service(service_spec, llama_8b(), [node(arch=arch, flags=(), memory="512Gi")], vllm_images=admins)
    assert (plan.node_profile.arch, plan.image) == (arch, image)


def rendered(capsys: pytest.CaptureFixture[str], example: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cli(capsys, "render", str(example), "--nodes", NODES, "-o", "json")["items"]
    return items


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_no_admin_image_for_the_arch_renders_every_child_as_before(example, monkeypatch, capsys):
    """An operator upgrade must not restart servers: with vllm_images unset, empty, or naming only another arch (the
    examples plan onto amd64), `cpullm render` prints the same children, their pods on vLLM's published image."""
    before = rendered(capsys, example)
    servers = [c for c in before if c["kind"] == "Deployment" and not c["metadata"]["name"].endswith("-router")]
    assert [c["image"] for s in servers for c in s["spec"]["template"]["spec"]["containers"]] == [PUBLISHED["amd64"]]
    for setting in ("{}", json.dumps({"arm64": PINNED["arm64"]})):
        monkeypatch.setenv("CPULLM_VLLM_IMAGES", setting)
        assert rendered(capsys, example) == before, setting


@pytest.mark.parametrize(
    ("asked", "arch", "image"),
    [
        pytest.param(None, "amd64", PINNED["amd64"], id="amd64-the-admins"),
        pytest.param(None, "arm64", PINNED["arm64"], id="arm64-the-admins"),
        pytest.param("registry.corp/vllm:mine", "arm64", "registry.corp/vllm:mine", id="the-specs-own"),
    ],
)
def test_render_plan_and_the_reconciler_run_the_admins_image(asked, arch, image, monkeypatch, tmp_path, capsys):
    """CPULLM_VLLM_IMAGES (the chart's vllm.images) reaches the servers' Deployment and status.plan.image, offline
    (`cpullm render`, `cpullm plan`) and in the operator's reconcile alike, for the arch the plan chose."""
    monkeypatch.setenv("CPULLM_VLLM_IMAGES", json.dumps(PINNED))
    service = yaml.safe_load((ROOT / "manifests" / "examples" / "qwen-small.yaml").read_text())
    service["spec"]["nodeSelector"] = {"kubernetes.io/arch": arch}
    if asked:
        service["spec"]["image"] = asked
    printed, plan, kube = offline_and_operator(service, tmp_path, capsys)

    for children in (printed, kube.applied):
        (server,) = [c for c in children if c["kind"] == "Deployment"]
        assert [c["image"] for c in server["spec"]["template"]["spec"]["containers"]] == [image]
    assert plan["nodeProfile"]["arch"] == arch
    assert plan["image"] == kube.status_patches[0]["plan"]["image"] == image
