"""The operator's own Prometheus metrics: counted by the reconciler and by io/kube.py. The default registry is
global (other tests count into it too), so every check reads the value before and compares the difference."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import REGISTRY, CollectorRegistry

from cpullm import metrics
from cpullm.controller.reconcile import Reconciler
from cpullm.controller.state import PerformanceWatch
from cpullm.core.observation import ClusterView, NamespaceFacts
from cpullm.errors import ChildRejected, ModelConfigUnavailable, PermissionDenied, TransientApiError
from cpullm.io.kube import Kube

from .builders import node
from .fake_api import RESET, FakeTransport, kube
from .support import StubHub, state_of

NODES = [node("n1", numa=2, memory="512Gi")]
READY = {"status": {"replicas": 1, "readyReplicas": 1}}
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama", "namespace": "serving"}}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def counts(*series: tuple[str, dict[str, str]]) -> list[float]:
    return [sample(name, **labels) for name, labels in series]


def delta(before: list[float], series: tuple[tuple[str, dict[str, str]], ...]) -> list[float]:
    return [after - was for after, was in zip(counts(*series), before, strict=True)]


# --- reconciles ----------------------------------------------------------------------------------------------


class StubKube:
    def __init__(self) -> None:
        self.terminating = False
        self.fail_apply: Exception | None = None
        self.fail_read: Exception | None = None
        self.status_patches: list[dict[str, Any]] = []

    def apply(self, manifest, over):
        if self.fail_apply is not None:
            raise self.fail_apply
        return manifest

    def delete(self, api_version, kind, namespace, name, owner_uid):
        pass

    def ownership(self, api_version, kind, namespace, name):
        return None

    def read_namespace(self, namespace):
        if self.fail_read is not None:
            raise self.fail_read
        return NamespaceFacts(terminating=self.terminating)

    def patch_service_status(self, namespace, name, status):
        self.status_patches.append(dict(status))

    def read_secret_key(self, namespace, name, key):
        return None

    def emit_event(self, regarding, type_, reason, message):
        pass


def service(name: str = "llama", uid: str = "u1", **fields: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "serving", "uid": uid, "generation": 1},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B"}, "kvCacheGiB": 4, "maxModelLen": 8192, **fields},
    }


def reconciler() -> tuple[Reconciler, StubKube]:
    kube = StubKube()
    return Reconciler(kube, StubHub(), clock=lambda: datetime(2026, 1, 1, tzinfo=UTC)), kube


OUTCOMES = ("planned", "refused", "retried", "skipped")
RECONCILES = tuple(("cpullm_reconciles_total", {"outcome": o}) for o in OUTCOMES)
DURATIONS = tuple(("cpullm_reconcile_duration_seconds_count", {"outcome": o}) for o in OUTCOMES)
REFUSALS = tuple(
    ("cpullm_plan_refusals_total", {"reason": r})
    for r in ("NoEligibleNode", "InvalidSpec", "ChildRejected", "PermissionDenied", "ApiUnavailable")
)


def _planned(rec: Reconciler, kube: StubKube) -> None:
    rec.reconcile(service(), ClusterView(nodes=NODES))


def _planned_twice(rec: Reconciler, kube: StubKube) -> None:
    rec.reconcile(service(), ClusterView(nodes=NODES))
    rec.reconcile(service(), ClusterView(nodes=NODES))  # nothing changed: still a reconcile


def _no_eligible_node(rec: Reconciler, kube: StubKube) -> None:
    rec.reconcile(service(cpu={"requiredISA": ["sve"]}), ClusterView(nodes=NODES))


def _invalid_spec(rec: Reconciler, kube: StubKube) -> None:
    rec.reconcile(service(replicas=-1), ClusterView(nodes=NODES))


def _child_rejected(rec: Reconciler, kube: StubKube) -> None:
    kube.fail_apply = ChildRejected("the API server refused to apply Deployment serving/llama")
    rec.reconcile(service(), ClusterView(nodes=NODES))


def _apply_forbidden(rec: Reconciler, kube: StubKube) -> None:
    kube.fail_apply = PermissionDenied("forbidden to apply Deployment serving/llama")
    rec.reconcile(service(), ClusterView(nodes=NODES))


def _api_unavailable(rec: Reconciler, kube: StubKube) -> None:
    kube.fail_read = TransientApiError("cannot read Namespace serving: HTTP 503")
    rec.reconcile(service(), ClusterView(nodes=NODES))


def _terminating(rec: Reconciler, kube: StubKube) -> None:
    kube.terminating = True
    rec.reconcile(service(), ClusterView(nodes=NODES))


@pytest.mark.parametrize(
    ("run", "reconciles", "refusals"),
    [
        pytest.param(_planned, [1, 0, 0, 0], [0, 0, 0, 0, 0], id="planned"),
        pytest.param(_planned_twice, [2, 0, 0, 0], [0, 0, 0, 0, 0], id="planned-twice"),
        pytest.param(_no_eligible_node, [0, 1, 0, 0], [1, 0, 0, 0, 0], id="no-eligible-node"),
        pytest.param(_invalid_spec, [0, 1, 0, 0], [0, 1, 0, 0, 0], id="invalid-spec"),
        pytest.param(_child_rejected, [0, 1, 0, 0], [0, 0, 1, 0, 0], id="child-rejected"),
        pytest.param(_apply_forbidden, [0, 0, 1, 0], [0, 0, 0, 0, 0], id="permission-denied-is-retried"),
        pytest.param(_api_unavailable, [0, 0, 1, 0], [0, 0, 0, 0, 0], id="api-unavailable-is-retried"),
        pytest.param(_terminating, [0, 0, 0, 1], [0, 0, 0, 0, 0], id="terminating-namespace-skipped"),
    ],
)
def test_reconciles_are_counted_by_outcome(
    run: Callable[[Reconciler, StubKube], None], reconciles: list[int], refusals: list[int]
):
    rec, kube = reconciler()
    before = counts(*RECONCILES), counts(*DURATIONS), counts(*REFUSALS)
    run(rec, kube)
    assert delta(before[0], RECONCILES) == reconciles
    assert delta(before[1], DURATIONS) == reconciles  # one duration observed per reconcile, same label
    assert delta(before[2], REFUSALS) == refusals


def test_services_by_readiness_counts_the_written_statuses():
    rec, kube = reconciler()
    assert rec.memory.readiness() == {"True": 0, "False": 0}
    rec.reconcile(service("a", "ua"), ClusterView(nodes=NODES, deployment=READY))  # planned, its one replica ready
    rec.reconcile(service("b", "ub"), ClusterView(nodes=NODES))  # planned, no pod ready yet
    rec.reconcile(service("c", "uc", cpu={"requiredISA": ["sve"]}), ClusterView(nodes=NODES))  # refused
    assert rec.memory.readiness() == {"True": 1, "False": 2}

    rec.reconcile(service("b", "ub"), ClusterView(nodes=NODES, deployment=READY))  # b becomes ready
    assert rec.memory.readiness() == {"True": 2, "False": 1}
    state_of(rec).forget("serving", "c", "uc")  # c deleted
    assert rec.memory.readiness() == {"True": 2, "False": 0}

    kube.terminating = True  # nothing reported for a terminating namespace: nothing counted
    rec.reconcile(service("d", "ud"), ClusterView(nodes=NODES))
    assert rec.memory.readiness() == {"True": 2, "False": 0}


def test_services_gauge_is_collected_at_scrape_time(monkeypatch):
    registry = CollectorRegistry()
    monkeypatch.setattr(metrics, "REGISTRY", registry)
    rec, _ = reconciler()
    metrics.track_services(rec.memory.readiness)
    assert registry.get_sample_value("cpullm_services", {"ready": "True"}) == 0.0
    assert registry.get_sample_value("cpullm_services", {"ready": "False"}) == 0.0
    rec.reconcile(service("a", "ua"), ClusterView(nodes=NODES, deployment=READY))
    rec.reconcile(service("b", "ub"), ClusterView(nodes=NODES))
    rec.reconcile(service("c", "uc"), ClusterView(nodes=NODES))
    assert registry.get_sample_value("cpullm_services", {"ready": "True"}) == 1.0
    assert registry.get_sample_value("cpullm_services", {"ready": "False"}) == 2.0


def test_predicted_speeds_are_those_of_the_services_the_check_reads(monkeypatch):
    """cpullm_predicted_*: read at scrape time from the plans the performance check parsed (services with ready
    servers), so they stand beside the servers' own series; a service without a prediction has none."""
    registry = CollectorRegistry()
    monkeypatch.setattr(metrics, "REGISTRY", registry)
    rec, _ = reconciler()
    plan = rec.reconcile(service("a", "ua"), ClusterView(nodes=NODES, deployment=READY))
    watch = PerformanceWatch()
    metrics.track_predictions(watch.predictions)
    assert (
        registry.get_sample_value("cpullm_predicted_decode_tokens_per_second", {"namespace": "serving", "service": "a"})
        is None
    )
    watch.parsed[("serving", "a")] = ("1", (plan, 8000))
    watch.parsed[("serving", "b")] = ("1", (plan.model_copy(update={"predicted": None}), 8000))
    watch.parsed[("serving", "c")] = ("1", None)
    p = plan.predicted
    a = {"namespace": "serving", "service": "a"}
    assert registry.get_sample_value("cpullm_predicted_decode_tokens_per_second", a) == p.decode_tokens_per_second
    streams = {**a, "streams": str(p.throughput_streams)}
    assert (
        registry.get_sample_value("cpullm_predicted_throughput_tokens_per_second", streams)
        == p.throughput_tokens_per_second
    )
    prompt = {**a, "prompt_tokens": str(p.prompt_tokens)}
    assert (
        registry.get_sample_value("cpullm_predicted_time_to_first_token_seconds", prompt)
        == p.time_to_first_token_seconds
    )
    names = {
        s.labels.get("service") for m in registry.collect() for s in m.samples if m.name.startswith("cpullm_predicted")
    }
    assert names == {"a"}


# --- API errors ----------------------------------------------------------------------------------------------


API_ERRORS = tuple(
    ("cpullm_api_errors_total", {"error": e})
    for e in ("PermissionDenied", "ChildRejected", "ApiUnavailable", "HTTP400", "HTTP404")
)


def _apply(k: Kube) -> None:
    k.apply(SERVICE, None)


def _delete(k: Kube) -> None:
    k.delete("autoscaling/v2", "HorizontalPodAutoscaler", "serving", "llama", "u1")


def _read_namespace(k: Kube) -> None:
    k.read_namespace("serving")


def _read_secret(k: Kube) -> None:
    k.read_secret_key("serving", "hf", "HF_TOKEN")


@pytest.mark.parametrize(
    ("call", "status", "error", "raised", "counted"),
    [
        pytest.param(_apply, 403, None, PermissionDenied, [1, 0, 0, 0, 0], id="apply-403"),
        pytest.param(_apply, 422, None, ChildRejected, [0, 1, 0, 0, 0], id="apply-422"),
        pytest.param(_apply, 503, None, TransientApiError, [0, 0, 1, 0, 0], id="apply-503"),
        pytest.param(_apply, 409, None, TransientApiError, [0, 0, 1, 0, 0], id="apply-409"),
        pytest.param(_apply, 0, RESET, TransientApiError, [0, 0, 1, 0, 0], id="apply-connection-reset"),
        pytest.param(_apply, 400, None, client.ApiException, [0, 0, 0, 1, 0], id="apply-400-unmapped"),
        # A 404 on an apply: the kind is not served yet (a CRD installed a moment ago), retried soon.
        pytest.param(_apply, 404, None, TransientApiError, [0, 0, 1, 0, 0], id="apply-404-kind-not-served"),
        pytest.param(_delete, 403, None, PermissionDenied, [1, 0, 0, 0, 0], id="delete-403"),
        pytest.param(_delete, 503, None, TransientApiError, [0, 0, 1, 0, 0], id="delete-503"),
        pytest.param(_delete, 0, RESET, TransientApiError, [0, 0, 1, 0, 0], id="delete-connection-reset"),
        pytest.param(_delete, 404, None, None, [0, 0, 0, 0, 0], id="delete-404-already-gone-not-an-error"),
        pytest.param(_delete, 200, None, None, [0, 0, 0, 0, 0], id="delete-not-the-services-left-alone"),
        pytest.param(_read_namespace, 403, None, PermissionDenied, [1, 0, 0, 0, 0], id="namespace-403"),
        pytest.param(_read_namespace, 503, None, TransientApiError, [0, 0, 1, 0, 0], id="namespace-503"),
        pytest.param(_read_namespace, 0, RESET, TransientApiError, [0, 0, 1, 0, 0], id="namespace-reset"),
        # Absent reads as not opted in (a tenant learns nothing of which Secrets exist): no API error either.
        pytest.param(
            _read_secret, 404, None, ModelConfigUnavailable, [0, 0, 0, 0, 0], id="secret-404-absent-not-an-api-error"
        ),
    ],
)
def test_api_errors_are_counted_by_the_typed_error(call, status, error, raised, counted):
    transport = FakeTransport(status, error=error)
    before = counts(*API_ERRORS)
    if raised is None:
        call(kube(transport))
    else:
        with pytest.raises(raised):
            call(kube(transport))
    assert delta(before, API_ERRORS) == counted
    assert len(transport.requests) == 1  # one request, no retry inside the client


OWNED = {"metadata": {"uid": "h1", "ownerReferences": [{"controller": True, "uid": "u1"}]}}


def test_delete_reads_the_controller_then_deletes_with_the_uid_precondition_at_the_childs_own_api():
    transport = FakeTransport(200, pages=[OWNED, {}] * 3)
    kube(transport).delete("keda.sh/v1alpha1", "ScaledObject", "serving", "llama", "u1")
    kube(transport).delete("monitoring.coreos.com/v1", "PodMonitor", "serving", "llama", "u1")
    kube(transport).delete("autoscaling/v2", "HorizontalPodAutoscaler", "serving", "llama", "u1")
    urls = [
        "http://api.invalid/apis/keda.sh/v1alpha1/namespaces/serving/scaledobjects/llama",
        "http://api.invalid/apis/monitoring.coreos.com/v1/namespaces/serving/podmonitors/llama",
        "http://api.invalid/apis/autoscaling/v2/namespaces/serving/horizontalpodautoscalers/llama",
    ]
    assert [(r["method"], r["url"]) for r in transport.requests] == [
        (method, url) for url in urls for method in ("GET", "DELETE")
    ]
    assert json.loads(transport.requests[1]["body"])["preconditions"] == {"uid": "h1"}


def test_delete_leaves_a_same_name_object_another_controller_owns():
    other = {"metadata": {"uid": "x", "ownerReferences": [{"controller": True, "uid": "someone-else"}]}}
    transport = FakeTransport(200, pages=[other])
    kube(transport).delete("autoscaling/v2", "HorizontalPodAutoscaler", "serving", "llama", "u1")
    assert [r["method"] for r in transport.requests] == ["GET"]


def test_a_failed_event_is_counted_but_not_raised():
    before = counts(*API_ERRORS)
    regarding = {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService", "name": "llama", "namespace": "serving"}
    kube(FakeTransport(403)).emit_event(regarding, "Normal", "Planned", "planned")
    assert delta(before, API_ERRORS) == [1, 0, 0, 0, 0]


def test_every_reconcile_outcome_has_its_series_before_the_first():
    """A rate of retries (the chart's CpuLLMOperatorRetrying) reads a series even before any reconcile retried."""
    for outcome in ("planned", "refused", "retried", "skipped", "superseded"):
        assert REGISTRY.get_sample_value("cpullm_reconciles_total", {"outcome": outcome}) is not None
