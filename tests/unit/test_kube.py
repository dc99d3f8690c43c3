"""io/kube.py through the real Kubernetes client with a fake transport: the client builds real requests and
parses real responses; only the network is replaced. Each API answer maps to the documented typed error."""

from __future__ import annotations

import json
import logging
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3
from kubernetes import client

from cpullm.core.children.sizing_job import SizingJobFacts
from cpullm.core.node_facts import NODE_FACT_SOURCES
from cpullm.core.observation import NamespaceFacts, Ownership
from cpullm.errors import ChildExists, ChildRejected, ModelConfigUnavailable, PermissionDenied, TransientApiError
from cpullm.io.kube import ABSENT_VERSION, REQUEST_TIMEOUT, Kube

from .fake_api import RESET, FakeTransport, kube

DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama", "namespace": "serving"}}
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama", "namespace": "serving"}}


@pytest.mark.parametrize(
    ("over", "force", "resource_version"),
    [(None, "false", ABSENT_VERSION), (Ownership(uid="d1", controller_uid="u1", resource_version="41"), "true", "41")],
    ids=["unknown-may-only-create", "its-own-forced-at-the-known-version"],
)
def test_apply_is_a_server_side_apply_under_our_field_manager(over, force, resource_version):
    """Over a child known as the service's, a forced apply preconditioned on its resourceVersion; where none is
    known, an unforced apply at a version no object holds, which only a create passes."""
    transport = FakeTransport(200, {**DEPLOYMENT, "status": {"readyReplicas": 1}})
    stored = kube(transport).apply(DEPLOYMENT, over)
    assert stored["status"] == {"readyReplicas": 1}
    (request,) = transport.requests
    assert request["method"] == "PATCH"
    assert request["url"].startswith("http://api.invalid/apis/apps/v1/namespaces/serving/deployments/llama?")
    assert "fieldManager=cpullm-operator" in request["url"] and f"force={force}" in request["url"]
    assert request["headers"]["Content-Type"] == "application/apply-patch+yaml"
    body = json.loads(request["body"])
    assert body["metadata"].pop("resourceVersion", None) == resource_version
    assert body == DEPLOYMENT


@pytest.mark.parametrize(
    ("status", "error", "expected", "message"),
    [
        (403, None, PermissionDenied, "forbidden to apply Service serving/llama: said 403"),
        (422, None, ChildRejected, "the API server refused to apply Service serving/llama: said 422"),
        (409, None, ChildExists, "cannot apply Service serving/llama: an object of that name exists"),
        (429, None, TransientApiError, "cannot apply Service serving/llama: HTTP 429 said 429"),
        (500, None, TransientApiError, "cannot apply Service serving/llama: HTTP 500 said 500"),
        (503, None, TransientApiError, "cannot apply Service serving/llama: HTTP 503 said 503"),
        (0, RESET, TransientApiError, "cannot apply Service serving/llama: ProtocolError"),
    ],
    ids=["403", "422", "409", "429", "500", "503", "connection-reset"],
)
def test_apply_errors_map_to_typed_errors(status, error, expected, message):
    with pytest.raises(expected) as raised:
        kube(FakeTransport(status, error=error)).apply(SERVICE, None)
    assert raised.value.message.startswith(message)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (  # what kube-apiserver answered while etcd was down (e2e/test_faults.py saw it)
            'Service "llama" is invalid: spec.clusterIPs: Invalid value: [""]: failed to allocate IP: rpc error: '
            "code = Unavailable desc = error reading from server: EOF",
            TransientApiError,
        ),
        (
            'Service "llama" is invalid: spec.clusterIPs: failed to allocate IP: context deadline exceeded',
            TransientApiError,
        ),
        ("etcdserver: request timed out", TransientApiError),
        (
            'Service "llama" is invalid: spec.clusterIPs: Invalid value: [""]: failed to allocate IP: range is full',
            ChildRejected,
        ),
        (
            'Deployment "llama" is invalid: spec.template.spec.containers[0].env[0].name: Invalid value: "1x"',
            ChildRejected,
        ),
    ],
    ids=["etcd-unavailable", "deadline", "etcd-timeout", "range-full", "bad-env"],
)
def test_a_422_caused_by_the_api_servers_storage_is_transient(message, expected):
    """A 422 is the spec's fault unless its cause is etcd failing under a validation that reads it."""
    with pytest.raises((ChildRejected, TransientApiError)) as raised:
        kube(FakeTransport(422, {"kind": "Status", "message": message})).apply(SERVICE, None)
    assert type(raised.value) is expected
    assert message in raised.value.message


def test_a_conflict_over_a_known_child_is_transient_not_a_taken_name():
    over = Ownership(uid="s1", controller_uid="u1", resource_version="41")
    with pytest.raises(TransientApiError) as raised:
        kube(FakeTransport(409)).apply(SERVICE, over)
    assert not isinstance(raised.value, ChildExists)
    assert raised.value.message.startswith("cannot apply Service serving/llama: HTTP 409 said 409")


def _items(*keys: tuple[str, str]) -> list[dict[str, object]]:
    """Metadata as a listing gives it: the markers are the UID and the generation (core/children's `marker`)."""
    meta = [{"namespace": ns, "name": name, "uid": f"u-{ns}-{name}", "generation": 2} for ns, name in keys]
    return [{"metadata": m} for m in meta]


def test_listing_owned_children_reads_labelled_metadata_page_by_page():
    pages = [
        {"metadata": {"continue": "next"}, "items": _items(("a", "x"), ("b", "y"))},
        {"metadata": {}, "items": _items(("b", "z"))},
    ]
    transport = FakeTransport(pages=pages)
    assert kube(transport).list_owned("Deployment", []) == {
        ("a", "x"): "u-a-x/2",
        ("b", "y"): "u-b-y/2",
        ("b", "z"): "u-b-z/2",
    }
    first, second = transport.requests
    url = urlsplit(first["url"])
    assert url.path == "/apis/apps/v1/deployments"
    assert parse_qs(url.query) == {"labelSelector": ["app.kubernetes.io/managed-by=cpullm-operator"], "limit": ["500"]}
    assert parse_qs(urlsplit(second["url"]).query)["continue"] == ["next"]
    assert first["headers"]["Accept"].startswith("application/json;as=PartialObjectMetadataList;")


@pytest.mark.parametrize(
    ("kind", "namespaces", "paths"),
    [
        ("PodDisruptionBudget", [], ["/apis/policy/v1/poddisruptionbudgets"]),
        ("InferencePool", ["a"], ["/apis/inference.networking.k8s.io/v1/namespaces/a/inferencepools"]),
    ],
)
def test_listing_owned_children_of_a_kind_without_a_typed_api(kind, namespaces, paths):
    transport = FakeTransport(pages=[{"metadata": {}, "items": _items(("a", "x"))}])
    assert kube(transport).list_owned(kind, namespaces) == {("a", "x"): "u-a-x/2"}
    assert [urlsplit(r["url"]).path for r in transport.requests] == paths
    assert transport.requests[0]["headers"]["Accept"].startswith("application/json;as=PartialObjectMetadataList;")


def test_listing_nodes_reads_every_page_whole():
    """`cpullm plan --from-cluster`: the nodes as the API returns them (labels and status, not metadata only)."""
    nodes = [{"kind": "Node", "metadata": {"name": f"n{i}", "labels": {"a": "b"}}, "status": {}} for i in range(3)]
    transport = FakeTransport(pages=[{"metadata": {"continue": "c"}, "items": nodes[:2]}, {"items": nodes[2:]}])
    assert kube(transport).list_nodes() == nodes
    first, second = transport.requests
    assert urlsplit(first["url"]).path == "/api/v1/nodes" and parse_qs(urlsplit(first["url"]).query) == {
        "limit": ["500"]
    }
    assert parse_qs(urlsplit(second["url"]).query)["continue"] == ["c"]
    assert "PartialObjectMetadata" not in first["headers"].get("Accept", "")


def test_listing_a_node_fact_source_reads_its_cluster_scoped_objects_or_none_where_unserved():
    source = NODE_FACT_SOURCES[0]  # NodeResourceTopology
    topology = {"metadata": {"name": "n1"}, "zones": []}
    transport = FakeTransport(pages=[{"metadata": {}, "items": [topology]}])
    assert kube(transport).list_node_facts(source) == [{"kind": "NodeResourceTopology", **topology}]
    path = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
    assert urlsplit(transport.requests[0]["url"]).path == path
    assert kube(FakeTransport(404, {"kind": "Status", "code": 404})).list_node_facts(source) == []
    with pytest.raises(PermissionDenied, match="forbidden to list noderesourcetopologies"):
        kube(FakeTransport(403, {"kind": "Status", "code": 403})).list_node_facts(source)


def test_listing_owned_children_of_watched_namespaces_lists_each_of_them():
    transport = FakeTransport(pages=[{"metadata": {}, "items": _items(("a", "x"))}, {"metadata": {}, "items": []}])
    assert kube(transport).list_owned("ConfigMap", ["a", "b"]) == {("a", "x"): "u-a-x/2"}
    urls = [r["url"].split("?")[0] for r in transport.requests]
    assert urls == [
        "http://api.invalid/api/v1/namespaces/a/configmaps",
        "http://api.invalid/api/v1/namespaces/b/configmaps",
    ]


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (RESET, "cannot list Services: ProtocolError"),
        # A connection closed mid-handshake: the client raises an ApiException of status 0 for it.
        (
            urllib3.exceptions.SSLError("[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred in violation of protocol"),
            "cannot list Services: SSLError: .*UNEXPECTED_EOF",
        ),
    ],
    ids=["reset", "tls-eof"],
)
def test_connection_errors_are_transient(error, message):
    with pytest.raises(TransientApiError, match=message):
        kube(FakeTransport(error=error)).list_owned("Service", [])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda k: k.apply(DEPLOYMENT, None), "cannot apply Deployment serving/llama: ProtocolError"),
        (lambda k: k.child_exists("Service", "serving", "llama"), "cannot read Service serving/llama: ProtocolError"),
        (lambda k: k.list_owned("Service", []), "cannot list Services: ProtocolError"),
        (lambda k: k.list_nodes(), "cannot list nodes: ProtocolError"),
    ],
    ids=["apply", "read-metadata", "list-owned", "list-nodes"],
)
def test_an_answer_cut_mid_body_is_transient(call, message):
    """The API server stopped while it sent the body (seen in the control-plane outage test): the read of the
    body fails, not the request, and that is as transient as a refused connection."""
    with pytest.raises(TransientApiError, match=message):
        call(kube(FakeTransport(200, {"metadata": {"name": "llama"}, "items": []}, cut=True)))


@pytest.mark.parametrize(
    ("kind", "status", "expected", "path"),
    [
        ("Deployment", 200, True, "/apis/apps/v1/namespaces/serving/deployments/llama"),
        ("Service", 404, False, "/api/v1/namespaces/serving/services/llama"),
        ("ConfigMap", 200, True, "/api/v1/namespaces/serving/configmaps/llama"),
        ("ConfigMap", 503, TransientApiError, "/api/v1/namespaces/serving/configmaps/llama"),
        ("Deployment", 403, PermissionDenied, "/apis/apps/v1/namespaces/serving/deployments/llama"),
    ],
    ids=["deployment-exists", "service-gone", "configmap-exists", "503", "403"],
)
def test_whether_a_child_exists_is_one_metadata_read(kind, status, expected, path):
    transport = FakeTransport(status, {"metadata": {"name": "llama"}} if status == 200 else None)
    if isinstance(expected, bool):
        assert kube(transport).child_exists(kind, "serving", "llama") is expected
    else:
        with pytest.raises(expected):
            kube(transport).child_exists(kind, "serving", "llama")
    (request,) = transport.requests
    assert (request["method"], urlsplit(request["url"]).path) == ("GET", path)
    assert request["headers"]["Accept"].startswith("application/json;as=PartialObjectMetadata;")


def test_every_request_has_a_deadline():
    """A connection the network dropped without a reset must not hold a reconcile thread for good."""
    transport = FakeTransport(200, {"metadata": {"name": "llama"}})
    kube(transport).child_exists("Deployment", "serving", "llama")
    (request,) = transport.requests
    timeout = request["timeout"]
    assert (timeout.connect_timeout, timeout.read_timeout) == REQUEST_TIMEOUT


def test_an_unmapped_answer_stays_loud():
    with pytest.raises(client.ApiException) as raised:
        kube(FakeTransport(400)).apply(SERVICE, None)
    assert raised.value.status == 400


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, {"metadata": {"name": "serving", "labels": {"a": "b"}}}, NamespaceFacts({"a": "b"}, False)),
        (  # its UID keys the node cache directories (core/children/model_cache.py)
            200,
            {"metadata": {"name": "serving", "uid": "0b6f2a4e-5c3d-4e1f-9a8b-7c6d5e4f3a2b"}},
            NamespaceFacts({}, False, "0b6f2a4e-5c3d-4e1f-9a8b-7c6d5e4f3a2b"),
        ),
        (200, {"metadata": {"name": "serving"}, "status": {"phase": "Terminating"}}, NamespaceFacts({}, True)),
        (
            200,
            {"metadata": {"name": "serving", "deletionTimestamp": "2026-01-01T00:00:00Z"}},
            NamespaceFacts({}, True),
        ),
        (404, {"kind": "Status", "reason": "NotFound", "code": 404}, NamespaceFacts({}, True)),  # already gone
        (403, None, PermissionDenied),
        (503, None, TransientApiError),
    ],
    ids=["labels", "uid", "terminating-phase", "deletion-timestamp", "gone", "403", "503"],
)
def test_read_namespace(status, body, expected):
    if isinstance(expected, NamespaceFacts):
        assert kube(FakeTransport(status, body)).read_namespace("serving") == expected
    else:
        with pytest.raises(expected):
            kube(FakeTransport(status, body)).read_namespace("serving")


@pytest.mark.parametrize(
    ("status", "expected"),
    [(200, None), (404, None), (403, PermissionDenied), (422, ChildRejected), (500, TransientApiError)],
    ids=["ok", "deleted-meanwhile", "403", "422", "500"],
)
def test_status_patch(status, expected):
    transport = FakeTransport(status, {"metadata": {"name": "llama"}} if status == 200 else None)
    if expected is None:
        kube(transport).patch_service_status("serving", "llama", {"readyReplicas": 1})
        (request,) = transport.requests
        assert request["method"] == "PATCH" and request["url"].endswith("/cpullmservices/llama/status")
        assert request["headers"]["Content-Type"] == "application/merge-patch+json"
        assert json.loads(request["body"]) == {"status": {"readyReplicas": 1}}
    else:
        with pytest.raises(expected):
            kube(transport).patch_service_status("serving", "llama", {"readyReplicas": 1})


OPTED_IN = {"labels": {"cpullm.io/hf-token": "true"}}


@pytest.mark.parametrize(
    ("status", "body", "key", "expected"),
    [
        (200, {"metadata": OPTED_IN, "data": {"HF_TOKEN": "aGZfc2VjcmV0"}}, "HF_TOKEN", "hf_secret"),
        (200, {"metadata": OPTED_IN, "data": {"OTHER": "eA=="}}, "HF_TOKEN", None),
        (403, None, "HF_TOKEN", PermissionDenied),
        (200, {"metadata": OPTED_IN, "data": {"HF_TOKEN": "//79"}}, "HF_TOKEN", ModelConfigUnavailable),  # ff fe fd
    ],
    ids=["value", "no-such-key", "403", "not-utf8"],
)
def test_read_secret_key(status, body, key, expected):
    transport = FakeTransport(status, body)
    if expected is PermissionDenied:
        with pytest.raises(PermissionDenied, match="forbidden to read Secret serving/hf"):
            kube(transport).read_secret_key("serving", "hf", key)
    elif expected is ModelConfigUnavailable:
        with pytest.raises(ModelConfigUnavailable, match=r"^secret serving/hf key HF_TOKEN is not UTF-8 text$"):
            kube(transport).read_secret_key("serving", "hf", key)
    else:
        assert kube(transport).read_secret_key("serving", "hf", key) == expected


@pytest.mark.parametrize(
    ("status", "error"), [(403, None), (500, None), (0, RESET)], ids=["403", "500", "connection-reset"]
)
def test_events_are_best_effort(status, error, caplog):
    regarding = {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService", "name": "llama", "namespace": "serving"}
    with caplog.at_level(logging.WARNING, logger="cpullm.io.kube"):
        kube(FakeTransport(status, error=error)).emit_event(regarding, "Warning", "NoEligibleNode", "no node")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "event NoEligibleNode on serving/llama not posted"
    ]


def test_event_body():
    transport = FakeTransport(201, echo=True)
    regarding = {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService", "name": "llama", "namespace": "serving"}
    kube(transport).emit_event(regarding, "Normal", "Planned", "x" * 2000)
    body = json.loads(transport.requests[0]["body"])
    assert body["involvedObject"] == regarding and body["metadata"]["generateName"] == "llama."
    assert (body["type"], body["reason"], len(body["message"])) == ("Normal", "Planned", 1024)
    assert body["reportingComponent"] == body["source"]["component"] == "cpullm-operator"


@pytest.mark.parametrize(
    ("status", "labels", "read_any", "readable"),
    [
        (200, {}, False, False),
        (200, {"cpullm.io/hf-token": "false"}, False, False),
        (404, None, False, False),
        (200, {}, True, True),
        (404, None, True, None),
    ],
    ids=["no-label", "label-false", "absent", "read-any-secret", "read-any-secret-absent"],
)
def test_only_secrets_that_opt_in_are_read(status, labels, read_any, readable):
    """A tenant may name any Secret of the namespace in hfTokenSecret (a TLS key, say): without the opt-in
    label it is not read into the operator, and the message never shows a value; an absent Secret reads the same,
    so the operator does not tell a tenant which Secrets exist."""
    body = {"metadata": {"labels": labels}, "data": {"tls.key": "c2VjcmV0LWtleQ=="}} if status == 200 else None
    gateway = Kube(kube(FakeTransport(status, body)).core.api_client, read_any_secret=read_any)
    if readable is not False:
        assert gateway.read_secret_key("serving", "tls", "tls.key") == ("secret-key" if readable else None)
    else:
        with pytest.raises(ModelConfigUnavailable) as caught:
            gateway.read_secret_key("serving", "tls", "tls.key")
        assert caught.value.message == (
            "secret serving/tls is absent or is not labelled cpullm.io/hf-token=true: the operator reads only "
            "Secrets that opt in (create it with the label, or install the operator with readAnySecret)"
        )


def test_listing_daemonsets_reads_every_namespace_and_names_their_kind():
    """`cpullm plan --from-cluster` leaves room for their pods: a list's items carry no kind, and a file's
    objects are told apart by it."""
    daemonsets = [{"metadata": {"name": f"d{i}", "namespace": "kube-system"}, "spec": {}} for i in range(2)]
    transport = FakeTransport(pages=[{"items": daemonsets}])
    assert kube(transport).list_daemonsets() == [{"kind": "DaemonSet", **d} for d in daemonsets]
    (request,) = transport.requests
    assert urlsplit(request["url"]).path == "/apis/apps/v1/daemonsets"


def test_a_probe_publishes_its_node_performance_by_a_forced_apply_of_its_own():
    """The probe's Job owns its node's NodePerformance: a forced server-side apply under its own field manager (a
    newer measurement replaces the older), cluster-scoped; a refusal is typed like any other write's."""
    manifest = {"apiVersion": "cpullm.io/v1alpha1", "kind": "NodePerformance", "metadata": {"name": "n1"}, "spec": {}}
    transport = FakeTransport(200, manifest)
    kube(transport).publish_node_performance(manifest)
    (request,) = transport.requests
    assert request["method"] == "PATCH"
    assert urlsplit(request["url"]).path == "/apis/cpullm.io/v1alpha1/nodeperformances/n1"
    query = parse_qs(urlsplit(request["url"]).query)
    assert (query["fieldManager"], query["force"]) == (["cpullm-probe"], ["true"])
    assert request["headers"]["Content-Type"] == "application/apply-patch+yaml"
    assert json.loads(request["body"]) == manifest
    with pytest.raises(PermissionDenied, match="apply NodePerformance n1"):
        kube(FakeTransport(403, {"kind": "Status", "code": 403})).publish_node_performance(manifest)


def _job(*conditions: tuple[str, str, str]) -> dict:
    return {
        "kind": "Job",
        "metadata": {
            "name": "chat-size-abc",
            "uid": "j1",
            "labels": {"app.kubernetes.io/managed-by": "cpullm-operator"},
            "ownerReferences": [{"uid": "u1", "controller": True}],
        },
        "status": {"conditions": [{"type": t, "status": s, "reason": r} for t, s, r in conditions]},
    }


def _unplaced(controller: str, message: str) -> dict:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    return {
        "metadata": {"ownerReferences": [{"uid": controller, "controller": True}]},
        "status": {"conditions": [condition]},
    }


def _pod(controller: str, message: str) -> dict:
    return {
        "metadata": {"ownerReferences": [{"uid": controller, "controller": True}]},
        "status": {"containerStatuses": [{"state": {"terminated": {"message": message}}}]},
    }


@pytest.mark.parametrize(
    ("pages", "expected"),
    [
        ([_job(), {"items": []}], SizingJobFacts(finished=False, controller_uid="u1")),
        (
            # The pod with the Job's label and a report of its own making, not controlled by the Job, is not read.
            [_job(("Complete", "True", "")), {"items": [_pod("other", "forged"), _pod("j1", "the report")]}],
            SizingJobFacts(finished=True, message="the report", controller_uid="u1"),
        ),
        (
            [_job(("Complete", "False", ""), ("Failed", "True", "DeadlineExceeded")), {"items": []}],
            SizingJobFacts(finished=True, reason="DeadlineExceeded", controller_uid="u1"),
        ),
        (
            # Running, its pod not placed: why, in the scheduler's words (a forged pod's trouble is not read).
            [_job(), {"items": [_unplaced("other", "forged"), _unplaced("j1", "0/3 nodes are available")]}],
            SizingJobFacts(
                finished=False,
                controller_uid="u1",
                trouble="a pod cannot be scheduled: 0/3 nodes are available",
            ),
        ),
    ],
    ids=["running", "complete", "failed", "running-unschedulable"],
)
def test_a_sizing_job_is_read_with_the_message_of_its_own_pod(pages, expected):
    transport = FakeTransport(200, pages=pages)
    assert kube(transport).read_sizing_job("team-a", "chat-size-abc") == expected
    assert transport.requests[0]["url"].startswith("http://api.invalid/apis/batch/v1/namespaces/team-a/jobs/chat-size")
    if len(pages) > 1:
        query = parse_qs(urlsplit(transport.requests[1]["url"]).query)
        assert query["labelSelector"] == ["batch.kubernetes.io/controller-uid=j1"]


def test_a_job_without_the_operators_label_is_no_services_whatever_it_names():
    forged = _job()
    del forged["metadata"]["labels"]
    found = kube(FakeTransport(200, pages=[forged, {"items": []}])).read_sizing_job("team-a", "x")
    assert found == SizingJobFacts(False)


def test_an_absent_sizing_job_is_none():
    assert kube(FakeTransport(404)).read_sizing_job("team-a", "chat-size-abc") is None
