"""The model cache volume (core/children/model_cache.py), and spec.modelCache.nodeLocal: a node directory the
operator chooses, per namespace and model, refused where the operator keeps none or Pod Security forbids it."""

import dataclasses

import pytest

from cpullm.api.spec import parse_spec
from cpullm.core.children.common import Owner
from cpullm.core.children.deployment import build_deployment
from cpullm.core.children.model_cache import node_cache_path
from cpullm.core.decision import decide_plan
from cpullm.core.observation import NamespaceFacts, Observed
from cpullm.errors import InvalidSpec, NodeCacheDisabled, PodSecurityForbidden

from .builders import llama_8b, node, spec

NODE_LOCAL = {"modelCache": {"nodeLocal": True}}


def observed(namespace: str = "team-a", labels: dict | None = None, node_cache_dir: str | None = "/var/lib/cpullm"):
    return Observed(
        owner=Owner("llama", namespace, "uid-1"),
        generation=1,
        spec=spec(**NODE_LOCAL),
        requested_replicas=1,
        namespace=NamespaceFacts(labels or {}),
        model=llama_8b(),
        nodes=(node("n1", numa=2, cpu="96", memory="512Gi"),),
        node_cache_dir=node_cache_dir,
    )


def test_a_node_local_cache_is_a_directory_per_namespace_and_model_under_the_operators():
    plan = decide_plan(observed())
    assert plan.node_cache_path == node_cache_path("/var/lib/cpullm", "team-a", spec().model)
    assert plan.node_cache_path.startswith("/var/lib/cpullm/team-a/meta-llama--Llama-3.1-8B-Instruct-")
    pod = build_deployment(Owner("llama", "team-a", "uid-1"), spec(**NODE_LOCAL), plan)["spec"]["template"]["spec"]
    (cache,) = [v for v in pod["volumes"] if v["name"] == "model-cache"]
    assert cache == {"name": "model-cache", "hostPath": {"path": plan.node_cache_path, "type": "DirectoryOrCreate"}}
    resources = pod["containers"][0]["resources"]
    assert "ephemeral-storage" not in resources["requests"]  # the node's directory, not the pod's ephemeral storage


def test_namespaces_models_and_revisions_get_directories_of_their_own():
    model = spec().model
    paths = {
        node_cache_path("/c", "a", model),
        node_cache_path("/c", "b", model),
        node_cache_path("/c", "a", model.model_copy(update={"revision": "v2"})),
        node_cache_path("/c", "a", model.model_copy(update={"name": "/models/../etc"})),
    }
    assert len(paths) == 4
    # A model's name is one directory whatever it holds: no separator, no "." or ".." to climb out of the namespace's.
    assert all(path.count("/") == 3 and path.split("/")[3] not in (".", "..") for path in paths)


def test_without_the_operators_directory_node_local_is_refused():
    refusal = decide_plan(observed(node_cache_dir=None))
    assert isinstance(refusal, NodeCacheDisabled) and "CPULLM_NODE_CACHE_DIR" in refusal.message


def test_pod_security_baseline_refuses_the_hostpath():
    labels = {"pod-security.kubernetes.io/enforce": "baseline"}
    baseline = dataclasses.replace(observed(labels=labels), spec=spec(numaPrivileges=False, **NODE_LOCAL))
    refusal = decide_plan(baseline)
    assert isinstance(refusal, PodSecurityForbidden) and "hostPath" in refusal.message


@pytest.mark.parametrize(
    "cache",
    [
        {"nodeLocal": True, "emptyDir": {}},
        {"nodeLocal": True, "persistentVolumeClaim": {"claimName": "models"}},
        {},
        {"nodeLocal": False},
    ],
)
def test_one_model_cache_source_exactly(cache):
    with pytest.raises(InvalidSpec, match="exactly one of persistentVolumeClaim, emptyDir or nodeLocal"):
        parse_spec({**spec().model_dump(by_alias=True, exclude_none=True), "modelCache": cache})
