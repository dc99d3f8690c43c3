"""The model cache volume (core/children/model_cache.py), and spec.modelCache.nodeLocal: node directories the
operator chooses, keyed by the namespace's UID (the weights, per model) and the service's (what a start compiles),
refused where the operator keeps none, Pod Security forbids it or a UID is not one; and the listing of the
directories whose namespace or service is gone (`cpullm node-cache-stale`)."""

import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from cpullm.api.spec import parse_spec
from cpullm.cli import main
from cpullm.core.children.common import Owner
from cpullm.core.children.deployment import build_deployment
from cpullm.core.children.model_cache import (
    UNKNOWN_NAMESPACE_UID,
    NodeCachePaths,
    model_directory,
    node_cache_paths,
    stale_node_cache,
)
from cpullm.core.decision import decide_plan
from cpullm.core.observation import NamespaceFacts, OperatorPolicy
from cpullm.errors import InvalidSpec, NodeCacheDisabled, PodSecurityForbidden
from cpullm.io.files import scan_node_cache

from . import support
from .builders import node, spec

NODE_LOCAL = {"modelCache": {"nodeLocal": True}}
NS_A = "0b6f2a4e-5c3d-4e1f-9a8b-7c6d5e4f3a2b"
NS_A_AGAIN = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"  # a namespace of the same name, made again
SVC_1 = "11111111-2222-4333-8444-555555555555"
SVC_1_AGAIN = "66666666-7777-4888-9999-aaaaaaaaaaaa"  # a service of the same name, made again
SVC_2 = "bbbbbbbb-cccc-4ddd-8eee-ffffffffffff"
NS_B = "cccccccc-dddd-4eee-8fff-000000000000"
LLAMA = spec().model
LLAMA_DIR = model_directory(LLAMA)


def observed(
    namespace_uid: str | None = NS_A,
    service_uid: str | None = SVC_1,
    labels: dict | None = None,
    node_cache_dir: str | None = "/var/lib/cpullm",
    name: str = "llama",
):
    return support.observed(
        owner=Owner(name, "team-a", service_uid),
        generation=1,
        spec=spec(**NODE_LOCAL),
        namespace=NamespaceFacts(labels or {}, uid=namespace_uid),
        nodes=(node("n1", numa=2, cpu="96", memory="512Gi"),),
        policy=OperatorPolicy(node_cache_dir=node_cache_dir),
    )


@pytest.mark.parametrize(
    ("directory", "namespace_uid", "service_uid", "weights", "compiled"),
    [
        pytest.param(
            "/var/lib/cpullm",
            NS_A,
            SVC_1,
            f"/var/lib/cpullm/ns.{NS_A}/models/{LLAMA_DIR}",
            f"/var/lib/cpullm/ns.{NS_A}/services/{SVC_1}",
            id="namespace-and-service-uid",
        ),
        pytest.param(
            "/var/lib/cpullm/",
            NS_A,
            SVC_2,
            f"/var/lib/cpullm/ns.{NS_A}/models/{LLAMA_DIR}",
            f"/var/lib/cpullm/ns.{NS_A}/services/{SVC_2}",
            id="another-service-shares-the-weights-not-the-compiled",
        ),
        pytest.param(
            "/c",
            NS_A_AGAIN,
            SVC_1_AGAIN,
            f"/c/ns.{NS_A_AGAIN}/models/{LLAMA_DIR}",
            f"/c/ns.{NS_A_AGAIN}/services/{SVC_1_AGAIN}",
            id="recreated-namespace-and-service",
        ),
        pytest.param(
            "/c",
            UNKNOWN_NAMESPACE_UID,
            None,
            f"/c/ns.<namespace-uid>/models/{LLAMA_DIR}",
            "/c/ns.<namespace-uid>/services/<service-uid>",
            id="offline-no-uids",
        ),
        pytest.param(
            "/c",
            UNKNOWN_NAMESPACE_UID,
            SVC_1,
            f"/c/ns.<namespace-uid>/models/{LLAMA_DIR}",
            f"/c/ns.<namespace-uid>/services/{SVC_1}",
            id="offline-service-file-with-uid",
        ),
    ],
)
def test_node_directories_are_keyed_by_uid(directory, namespace_uid, service_uid, weights, compiled):
    assert node_cache_paths(directory, namespace_uid, service_uid, LLAMA) == NodeCachePaths(weights, compiled)


@pytest.mark.parametrize(
    ("namespace_uid", "service_uid"),
    [
        pytest.param(NS_A_AGAIN, SVC_1, id="namespace-made-again"),
        pytest.param(NS_A, SVC_1_AGAIN, id="service-made-again"),
        pytest.param(NS_A_AGAIN, SVC_1_AGAIN, id="both-made-again"),
    ],
)
def test_a_namespace_or_service_made_again_under_its_name_finds_nothing_of_the_last_ones(namespace_uid, service_uid):
    """Same namespace name, same service name, same model: only the UIDs differ. A new namespace gets new weights
    and compile directories; a new service in the same namespace shares the weights, never the compiled code."""
    before = decide_plan(observed())
    after = decide_plan(observed(namespace_uid, service_uid))
    assert after.node_compile_cache_path != before.node_compile_cache_path
    assert (after.node_cache_path == before.node_cache_path) == (namespace_uid == NS_A)


@pytest.mark.parametrize(
    ("namespace_uid", "service_uid", "whose"),
    [
        pytest.param(None, SVC_1, "namespace", id="namespace-uid-unread"),
        pytest.param("", SVC_1, "namespace", id="namespace-uid-empty"),
        pytest.param("team-a", SVC_1, "namespace", id="namespace-name-for-uid"),
        pytest.param("../../etc", SVC_1, "namespace", id="namespace-traversal"),
        pytest.param(f"{NS_A}/../..", SVC_1, "namespace", id="namespace-uuid-then-traversal"),
        pytest.param(NS_A.upper(), SVC_1, "namespace", id="namespace-uppercase-spelling"),
        pytest.param(f"{{{NS_A}}}", SVC_1, "namespace", id="namespace-braced"),
        pytest.param(NS_A, None, "service", id="service-uid-unknown-in-the-cluster"),
        pytest.param(NS_A, "uid-1", "service", id="service-not-a-uuid"),
        pytest.param(NS_A, "..", "service", id="service-dotdot"),
        pytest.param(NS_A, "<service-uid>", "service", id="service-placeholder-in-the-cluster"),
        pytest.param(NS_A, f"{SVC_1}\n", "service", id="service-trailing-newline"),
        pytest.param(UNKNOWN_NAMESPACE_UID, "../x", "service", id="offline-service-traversal"),
    ],
)
def test_a_uid_that_is_not_a_uuid_is_refused(namespace_uid, service_uid, whose):
    refusal = decide_plan(observed(namespace_uid, service_uid))
    assert isinstance(refusal, NodeCacheDisabled)
    assert f"keyed by the {whose}'s UID" in refusal.message and "not a UUID" in refusal.message


def test_the_pod_mounts_the_weights_at_models_and_its_own_compile_cache_over_vllm_cache_root():
    plan = decide_plan(observed())
    pod = build_deployment(Owner("llama", "team-a", SVC_1), spec(**NODE_LOCAL), plan)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"] == {
        "name": "model-cache",
        "hostPath": {"path": f"/var/lib/cpullm/ns.{NS_A}/models/{LLAMA_DIR}", "type": "DirectoryOrCreate"},
    }
    assert volumes["compile-cache"] == {
        "name": "compile-cache",
        "hostPath": {"path": f"/var/lib/cpullm/ns.{NS_A}/services/{SVC_1}", "type": "DirectoryOrCreate"},
    }
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert (mounts["model-cache"], mounts["compile-cache"]) == ("/models", "/models/vllm")
    env = {e["name"]: e.get("value") for e in container["env"]}
    # What a start compiles, the AOT compile cache included, is all under VLLM_CACHE_ROOT: in the service's own.
    assert env["HF_HOME"] == "/models/huggingface"
    assert env["VLLM_CACHE_ROOT"] == "/models/vllm"
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith("/models/vllm/")
    assert env["VLLM_USE_AOT_COMPILE"] == "1"
    # A hostPath is not the pod's ephemeral storage: the kubelet neither counts nor bounds it.
    assert "ephemeral-storage" not in container["resources"]["requests"]


@pytest.mark.parametrize("cache", [{"persistentVolumeClaim": {"claimName": "models"}}, {"emptyDir": {}}, None])
def test_other_caches_keep_what_a_start_compiles_in_the_model_cache_volume(cache):
    fields = {"modelCache": cache} if cache else {}
    plan = dataclasses.replace(observed(), spec=spec(**fields))
    pod = build_deployment(Owner("llama", "team-a", SVC_1), spec(**fields), decide_plan(plan))
    pod_spec = pod["spec"]["template"]["spec"]
    assert "compile-cache" not in {v["name"] for v in pod_spec["volumes"]}
    assert "/models/vllm" not in {m["mountPath"] for m in pod_spec["containers"][0]["volumeMounts"]}


def test_models_and_revisions_get_directories_of_their_own_in_one_path_component():
    models = [
        LLAMA,
        LLAMA.model_copy(update={"revision": "v2"}),
        LLAMA.model_copy(update={"name": "/models/../etc"}),
        LLAMA.model_copy(update={"name": ".."}),
    ]
    paths = {node_cache_paths("/c", NS_A, SVC_1, model).weights for model in models}
    assert len(paths) == 4
    # A model's name is one directory whatever it holds: no separator, no "." or ".." to climb out of models/.
    prefix = f"/c/ns.{NS_A}/models/"
    assert all(
        p.startswith(prefix) and "/" not in p[len(prefix) :] and p[len(prefix) :] not in ("", ".", "..") for p in paths
    )


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
    with pytest.raises(InvalidSpec, match="exactly one of persistentVolumeClaim, emptyDir, nodeLocal"):
        parse_spec({**spec().model_dump(by_alias=True, exclude_none=True), "modelCache": cache})


# The cleanup: which directories of a node's cache an admin may remove, given the cluster's UIDs.
OLD, NEW = 1_000.0, 9_000.0  # changed before the listing (less its margin), and since
LIVE_NAMESPACES, LIVE_SERVICES = {NS_A}, {SVC_1}


@pytest.mark.parametrize(
    ("entries", "stale", "foreign"),
    [
        pytest.param({f"ns.{NS_A}": OLD, f"ns.{NS_A}/services/{SVC_1}": OLD}, [], [], id="all-live"),
        pytest.param({f"ns.{NS_A_AGAIN}": OLD}, [f"ns.{NS_A_AGAIN}"], [], id="namespace-gone"),
        pytest.param(
            {f"ns.{NS_A_AGAIN}": OLD, f"ns.{NS_A_AGAIN}/services/{SVC_2}": OLD},
            [f"ns.{NS_A_AGAIN}"],
            [],
            id="namespace-gone-removed-whole",
        ),
        pytest.param(
            {f"ns.{NS_A}": OLD, f"ns.{NS_A}/services/{SVC_2}": OLD},
            [f"ns.{NS_A}/services/{SVC_2}"],
            [],
            id="service-gone",
        ),
        pytest.param({f"ns.{NS_A_AGAIN}": NEW}, [], [], id="namespace-made-since-the-listing"),
        pytest.param({f"ns.{NS_A}": OLD, f"ns.{NS_A}/services/{SVC_2}": NEW}, [], [], id="service-made-since"),
        pytest.param({f"ns.{NS_A}": OLD, f"ns.{NS_A}/services/not-a-uid": OLD}, [], [], id="not-a-service-directory"),
        pytest.param({"team-a": OLD, "lost+found": OLD}, [], ["lost+found", "team-a"], id="foreign-left-alone"),
        pytest.param({f"ns.{NS_A.upper()}": OLD}, [], [f"ns.{NS_A.upper()}"], id="not-a-canonical-uid"),
    ],
)
def test_stale_node_cache(entries, stale, foreign):
    assert stale_node_cache(entries, LIVE_NAMESPACES, LIVE_SERVICES, before=5_000.0) == (stale, foreign)


def _listing(path: Path, namespaces: list[str], services: list[str]) -> Path:
    items = [{"kind": "Namespace", "metadata": {"name": f"ns{i}", "uid": u}} for i, u in enumerate(namespaces)]
    items += [{"kind": "CpuLLMService", "metadata": {"name": f"s{i}", "uid": u}} for i, u in enumerate(services)]
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def test_the_cli_lists_a_nodes_stale_directories(tmp_path, capsys):
    cache = tmp_path / "cache"
    for directory in (
        f"ns.{NS_A}/models/{LLAMA_DIR}",
        f"ns.{NS_A}/services/{SVC_1}",
        f"ns.{NS_A}/services/{SVC_2}",
        f"ns.{NS_A_AGAIN}/services/{SVC_1_AGAIN}",
        "team-a/legacy",
    ):
        (cache / directory).mkdir(parents=True)
    # A namespace directory whose services/ leads elsewhere is not followed there.
    (tmp_path / "elsewhere" / SVC_2).mkdir(parents=True)
    (cache / f"ns.{NS_B}").mkdir()
    (cache / f"ns.{NS_B}" / "services").symlink_to(tmp_path / "elsewhere")
    listing = _listing(tmp_path / "cluster.yaml", [NS_A, NS_B], [SVC_1])
    taken = listing.stat().st_mtime
    for path in cache.rglob("*"):
        os.utime(path, (taken - 7200, taken - 7200), follow_symlinks=False)
    assert set(scan_node_cache(str(cache))) == {
        f"ns.{NS_A}",
        f"ns.{NS_A}/services/{SVC_1}",
        f"ns.{NS_A}/services/{SVC_2}",
        f"ns.{NS_A_AGAIN}",
        f"ns.{NS_A_AGAIN}/services/{SVC_1_AGAIN}",
        f"ns.{NS_B}",
        "team-a",
    }
    assert main(["node-cache-stale", str(cache), "--cluster", str(listing)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{cache}/ns.{NS_A}/services/{SVC_2}", f"{cache}/ns.{NS_A_AGAIN}"]
    assert f"{cache}/team-a: not of the operator's layout" in err


def test_the_cli_refuses_a_listing_without_namespaces(tmp_path, capsys):
    (tmp_path / "cache" / f"ns.{NS_A}").mkdir(parents=True)
    listing = _listing(tmp_path / "cluster.yaml", [], [SVC_1])
    assert main(["node-cache-stale", str(tmp_path / "cache"), "--cluster", str(listing)]) == 1
    assert "no Namespace" in capsys.readouterr().err


def test_the_cli_renders_the_uids_it_cannot_know_as_placeholders(tmp_path, monkeypatch, capsys):
    """Offline there is no Namespace object: `<namespace-uid>`; a service file without metadata.uid:
    `<service-uid>` (with one, as `kubectl get -o yaml` prints it, that uid)."""
    root = Path(__file__).resolve().parents[2]
    example = yaml.safe_load((root / "manifests" / "examples" / "qwen-small.yaml").read_text())
    example["spec"]["modelCache"] = {"nodeLocal": True}
    example["metadata"].pop("uid", None)
    service = tmp_path / "service.yaml"
    service.write_text(yaml.safe_dump(example))
    monkeypatch.setenv("CPULLM_NODE_CACHE_DIR", "/var/lib/cpullm")
    assert main(["render", str(service), "--nodes", str(root / "examples" / "nodes.yaml"), "--no-launcher"]) == 0
    (deployment,) = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o["kind"] == "Deployment"]
    paths = {
        v["name"]: v["hostPath"]["path"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "hostPath" in v
    }
    assert paths["compile-cache"] == "/var/lib/cpullm/ns.<namespace-uid>/services/<service-uid>"
    assert paths["model-cache"].startswith("/var/lib/cpullm/ns.<namespace-uid>/models/")
    assert main(["plan", str(service), "--nodes", str(root / "examples" / "nodes.yaml")]) == 0
    assert "no size limit" in capsys.readouterr().out
