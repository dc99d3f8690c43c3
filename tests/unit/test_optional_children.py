"""The optional children (PodMonitor, HorizontalPodAutoscaler, KEDA ScaledObject): their whole manifests, the
spec rules that guard them (pydantic and the CRD's CEL), how `decide` leaves out a child whose CRD is missing
and lists the ones to delete, and the reconciler deleting those once."""

from __future__ import annotations

from typing import Any

import pytest

from cpullm.api.crd import build_crd
from cpullm.api.spec import parse_spec
from cpullm.controller.reconcile import Reconciler
from cpullm.core.children import build_children
from cpullm.core.children.autoscaler import build_autoscaler
from cpullm.core.children.common import Owner
from cpullm.core.children.podmonitor import build_pod_monitor
from cpullm.core.decision import Decision, decide
from cpullm.core.observation import ClusterView, NamespaceFacts, Observed
from cpullm.core.planner import plan_service
from cpullm.errors import ChildRejected, InvalidSpec, NoEligibleNode, PermissionDenied

from . import support
from .builders import LLAMA_METADATA as METADATA
from .builders import LLAMA_OWNER as OWNER
from .builders import LLAMA_OWNER_REFERENCE as OWNER_REFERENCE
from .builders import llama_8b, node, spec
from .support import T0, RecordingKube, StubHub, service

T0_TEXT = "2026-01-01T12:00:00Z"
NODES = (node("n1", numa=2, memory="512Gi"),)
PROMETHEUS = "http://prometheus.monitoring:9090"
PODMONITOR_CRD = "podmonitors.monitoring.coreos.com"
SCALEDOBJECT_CRD = "scaledobjects.keda.sh"
ALL_CRDS = frozenset({PODMONITOR_CRD, SCALEDOBJECT_CRD})
TARGET = {"apiVersion": "cpullm.io/v1alpha1", "kind": "CpuLLMService", "name": "llama"}
WAITING_QUERY = 'sum(vllm:num_requests_waiting{namespace="serving",cpullm_service="llama"})'
KV_QUERY = 'avg(vllm:kv_cache_usage_perc{namespace="serving",cpullm_service="llama"})'

HPA = {"kind": "hpa", "maxReplicas": 4}
KEDA = {"kind": "keda", "maxReplicas": 4, "prometheusAddress": PROMETHEUS}
MONITORED = {"podMonitor": True}


def plan_for(service_spec: Any) -> Any:
    return plan_service(service_spec, llama_8b(), NODES)


def both(service_spec: Any, owner: Owner = OWNER) -> tuple[Any, Any]:
    plan = plan_for(service_spec)
    return build_pod_monitor(owner, service_spec, plan), build_autoscaler(owner, service_spec, plan)


# --- manifests -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("monitoring", "interval"),
    [({"podMonitor": True}, "30s"), ({"podMonitor": True, "interval": "15s"}, "15s")],
    ids=["default-interval", "15s"],
)
def test_pod_monitor_whole_manifest(monitoring, interval):
    pod_monitor, autoscaler = both(spec(monitoring=monitoring))
    assert autoscaler is None
    assert pod_monitor == {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": METADATA,
        "spec": {
            "selector": {"matchLabels": {"cpullm.io/service": "llama"}},
            "podMetricsEndpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": interval,
                    "relabelings": [
                        {
                            "sourceLabels": ["__meta_kubernetes_pod_label_cpullm_io_service"],
                            "targetLabel": "cpullm_service",
                        }
                    ],
                }
            ],
        },
    }


def test_a_pod_monitor_sends_the_api_key_where_metrics_need_it():
    """spec.apiKeySecret.metrics: key: Prometheus scrapes with the key from the service's own Secret (the Prometheus
    Operator reads it in the PodMonitor's namespace); open: it sends none."""
    keyed = {"name": "llama-key", "key": "token", "metrics": "key"}
    pod_monitor, _ = both(spec(monitoring={"podMonitor": True}, apiKeySecret=keyed))
    (endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]  # type: ignore[index]
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "llama-key", "key": "token"}}
    open_metrics, _ = both(spec(monitoring={"podMonitor": True}, apiKeySecret={"name": "llama-key"}))
    assert "authorization" not in open_metrics["spec"]["podMetricsEndpoints"][0]  # type: ignore[index]


def _hpa_metric(name: str, average: str) -> dict[str, Any]:
    return {
        "type": "Pods",
        "pods": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": average}},
    }


WAITING_2 = _hpa_metric("vllm_num_requests_waiting", "2")


@pytest.mark.parametrize(
    ("autoscaling", "min_max", "metrics", "stabilization"),
    [
        pytest.param(HPA, (1, 4), [WAITING_2], 900, id="defaults"),
        pytest.param(
            {**HPA, "minReplicas": 2, "maxReplicas": 8, "targetWaitingRequests": 5, "scaleDownStabilizationSeconds": 0},
            (2, 8),
            [_hpa_metric("vllm_num_requests_waiting", "5")],
            0,
            id="explicit",
        ),
        # The KV cache guard's target, a quantity in thousandths (no float truncation: 0.57 is 570m).
        *(
            pytest.param(
                {**HPA, "maxKvCacheUsage": usage},
                (1, 4),
                [WAITING_2, _hpa_metric("vllm_kv_cache_usage_perc", quantity)],
                900,
                id=case,
            )
            for usage, quantity, case in [
                (0.8, "800m", "kv-guard-0.8"),
                (0.57, "570m", "kv-guard-0.57-no-float-truncation"),
                (0.01, "10m", "kv-guard-minimum"),
                (1, "1000m", "kv-guard-maximum"),
            ]
        ),
    ],
)
def test_horizontal_pod_autoscaler_whole_manifest(autoscaling, min_max, metrics, stabilization):
    pod_monitor, hpa = both(spec(autoscaling=autoscaling))
    assert pod_monitor is None
    assert hpa == {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": METADATA,
        "spec": {
            "scaleTargetRef": TARGET,
            "minReplicas": min_max[0],
            "maxReplicas": min_max[1],
            "metrics": metrics,
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": stabilization}},
        },
    }


def _trigger(metric_type: str, query: str, threshold: str) -> dict[str, Any]:
    return {
        "type": "prometheus",
        "metricType": metric_type,
        "metadata": {"serverAddress": PROMETHEUS, "query": query, "threshold": threshold},
    }


@pytest.mark.parametrize(
    ("autoscaling", "min_max", "triggers", "stabilization"),
    [
        pytest.param(KEDA, (1, 4), [_trigger("AverageValue", WAITING_QUERY, "2")], 900, id="defaults"),
        pytest.param(
            {
                **KEDA,
                "minReplicas": 0,
                "maxReplicas": 3,
                "targetWaitingRequests": 4,
                "scaleDownStabilizationSeconds": 60,
            },
            (0, 3),
            [_trigger("AverageValue", WAITING_QUERY, "4")],
            60,
            id="scale-to-zero",
        ),
        pytest.param(
            {**KEDA, "maxKvCacheUsage": 0.75},
            (1, 4),
            [_trigger("AverageValue", WAITING_QUERY, "2"), _trigger("Value", KV_QUERY, "0.75")],
            900,
            id="kv-guard",
        ),
    ],
)
def test_scaled_object_whole_manifest(autoscaling, min_max, triggers, stabilization):
    pod_monitor, scaled_object = both(spec(autoscaling=autoscaling))
    assert pod_monitor is None
    assert scaled_object == {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": METADATA,
        "spec": {
            "scaleTargetRef": TARGET,
            "minReplicaCount": min_max[0],
            "maxReplicaCount": min_max[1],
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": stabilization}}
                }
            },
            "triggers": triggers,
        },
    }


def test_the_query_names_the_owners_namespace_and_name():
    pod_monitor, scaled_object = both(spec(autoscaling=KEDA), Owner(name="qwen", namespace="team-a", uid="u9"))
    assert pod_monitor is None
    assert scaled_object["spec"]["triggers"][0]["metadata"]["query"] == (
        'sum(vllm:num_requests_waiting{namespace="team-a",cpullm_service="qwen"})'
    )
    assert scaled_object["spec"]["scaleTargetRef"] == {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "name": "qwen",
    }


@pytest.mark.parametrize(
    "fields",
    [{}, {"monitoring": {"podMonitor": False, "interval": "10s"}}],
    ids=["unset", "podMonitor-false"],
)
def test_nothing_optional_when_not_asked_for(fields):
    service_spec = spec(**fields)
    assert both(service_spec) == (None, None)
    assert [c["kind"] for c in build_children(OWNER, service_spec, plan_for(service_spec))] == [
        NP,
        "ConfigMap",
        "Service",
        "Deployment",
    ]


@pytest.mark.parametrize(
    ("owner", "references"),
    [(OWNER, [OWNER_REFERENCE]), (Owner(name="llama", namespace="serving"), None)],
    ids=["operator", "offline"],
)
def test_owner_references_on_every_optional_child(owner, references):
    for autoscaling in (HPA, KEDA):
        service_spec = spec(monitoring=MONITORED, autoscaling=autoscaling)
        for child in both(service_spec, owner):
            assert child["metadata"].get("ownerReferences") == references


def test_children_in_apply_order():
    service_spec = spec(monitoring=MONITORED, autoscaling=HPA)
    assert [(c["apiVersion"], c["kind"]) for c in build_children(OWNER, service_spec, plan_for(service_spec))] == [
        ("networking.k8s.io/v1", NP),
        ("v1", "ConfigMap"),
        ("policy/v1", PDB),
        ("v1", "Service"),
        ("apps/v1", "Deployment"),
        ("monitoring.coreos.com/v1", "PodMonitor"),
        ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ]


# --- spec validation -----------------------------------------------------------------------------------------

BASE_SPEC = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "kvCacheGiB": 4}
MIN_OVER_MAX = "minReplicas must not exceed maxReplicas"
ZERO_NEEDS_KEDA = "scaling to zero (minReplicas 0) needs kind keda"
KEDA_NEEDS_PROMETHEUS = "kind keda needs prometheusAddress (KEDA's Prometheus trigger queries it)"


@pytest.mark.parametrize(
    ("autoscaling", "message"),
    [
        ({"minReplicas": 5, "maxReplicas": 4}, MIN_OVER_MAX),
        ({"kind": "keda", "minReplicas": 5, "maxReplicas": 4, "prometheusAddress": PROMETHEUS}, MIN_OVER_MAX),
        ({"minReplicas": 0, "maxReplicas": 4}, ZERO_NEEDS_KEDA),
        ({"kind": "hpa", "minReplicas": 0, "maxReplicas": 4}, ZERO_NEEDS_KEDA),
        ({"kind": "keda", "maxReplicas": 4}, KEDA_NEEDS_PROMETHEUS),
    ],
    ids=["hpa-min-over-max", "keda-min-over-max", "zero-default-kind", "zero-hpa", "keda-no-prometheus"],
)
def test_inconsistent_autoscaling_is_an_invalid_spec(autoscaling, message):
    with pytest.raises(InvalidSpec) as raised:
        parse_spec({**BASE_SPEC, "autoscaling": autoscaling})
    assert raised.value.message == f"spec.autoscaling: Value error, {message}"


@pytest.mark.parametrize(
    ("autoscaling", "expected"),
    [
        ({"kind": "keda", "minReplicas": 0, "maxReplicas": 2, "prometheusAddress": PROMETHEUS}, ("keda", 0, 2)),
        ({"minReplicas": 4, "maxReplicas": 4}, ("hpa", 4, 4)),
        ({"maxReplicas": 1}, ("hpa", 1, 1)),
    ],
    ids=["keda-scale-to-zero", "min-equals-max", "defaults"],
)
def test_consistent_autoscaling_parses(autoscaling, expected):
    scaling = parse_spec({**BASE_SPEC, "autoscaling": autoscaling}).autoscaling
    assert scaling is not None
    assert (scaling.kind.value, scaling.min_replicas, scaling.max_replicas) == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [("maxKvCacheUsage", 0), ("maxKvCacheUsage", 1.5), ("targetWaitingRequests", 0), ("maxReplicas", 0)],
)
def test_out_of_range_autoscaling_fields_are_refused(field, value):
    with pytest.raises(InvalidSpec) as raised:
        parse_spec({**BASE_SPEC, "autoscaling": {"maxReplicas": 4, field: value}})
    assert raised.value.message.startswith(f"spec.autoscaling.{field}: ")


def test_monitoring_interval_pattern():
    assert parse_spec({**BASE_SPEC, "monitoring": {"interval": "500ms"}}).monitoring.interval == "500ms"
    with pytest.raises(InvalidSpec) as raised:
        parse_spec({**BASE_SPEC, "monitoring": {"interval": "30"}})
    assert raised.value.message.startswith("spec.monitoring.interval: String should match pattern")


def test_crd_carries_the_same_rules_as_cel():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    autoscaling = schema["properties"]["spec"]["properties"]["autoscaling"]
    assert autoscaling["x-kubernetes-validations"] == [
        {"rule": "self.minReplicas <= self.maxReplicas", "message": MIN_OVER_MAX},
        {"rule": "self.minReplicas > 0 || self.kind == 'keda'", "message": ZERO_NEEDS_KEDA},
        {"rule": "self.kind != 'keda' || has(self.prometheusAddress)", "message": KEDA_NEEDS_PROMETHEUS},
        {
            "rule": "!has(self.prometheusAddress) || "
            "!self.prometheusAddress.matches('^https?://(localhost([:/.]|$)|127[.]|169[.]254[.]|0[.])')",
            "message": "prometheusAddress must not name a loopback or link-local host (KEDA's own pod would query it)",
        },
    ]
    # The CEL rules read these fields with no has(): the API server must default them before validating.
    assert autoscaling["properties"]["kind"]["default"] == "hpa"
    assert autoscaling["properties"]["minReplicas"]["default"] == 1
    assert autoscaling["required"] == ["maxReplicas"]


# --- decide --------------------------------------------------------------------------------------------------


def observed(
    installed_crds: frozenset[str] | None = ALL_CRDS, status: dict[str, Any] | None = None, **fields: Any
) -> Observed:
    """support.observed for this module's owner, with every optional API's CRD installed unless a test says not."""
    return support.observed(**{"owner": OWNER, "installed_crds": installed_crds, "status": status or {}, **fields})


def kinds(decision: Decision) -> list[str]:
    return [child["kind"] for child in decision.children]


def conditions(decision: Decision) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in decision.status["conditions"]}


# On by default (spec.networkPolicy): the servers' NetworkPolicy comes first, before what it guards.
NP = "NetworkPolicy"
BASE_KINDS = [NP, "ConfigMap", "Service", "Deployment"]
# An autoscaler may scale to more than one server: the servers get a PodDisruptionBudget (built-in, no CRD).
PDB = "PodDisruptionBudget"
SCALED_KINDS = [NP, "ConfigMap", PDB, "Service", "Deployment"]
POD_MONITOR_MISSING = (
    "False",
    "PodMonitorCRDMissing",
    "the PodMonitor API (monitoring.coreos.com/v1) is not installed: install the Prometheus Operator's CRDs "
    "(CRD podmonitors.monitoring.coreos.com); the PodMonitor is applied as soon as it is",
)
SCALED_OBJECT_MISSING = (
    "False",
    "ScaledObjectCRDMissing",
    "the ScaledObject API (keda.sh/v1alpha1) is not installed: install KEDA (CRD scaledobjects.keda.sh); "
    "the ScaledObject is applied as soon as it is",
)
POD_MONITOR_APPLIED = ("True", "PodMonitorApplied", "PodMonitor llama")
HPA_APPLIED = ("True", "HorizontalPodAutoscalerApplied", "HorizontalPodAutoscaler llama")
SCALED_OBJECT_APPLIED = ("True", "ScaledObjectApplied", "ScaledObject llama")


@pytest.mark.parametrize(
    ("fields", "crds", "applied", "features", "optional"),
    [
        pytest.param(
            {"monitoring": MONITORED, "autoscaling": KEDA},
            None,
            [*SCALED_KINDS, "PodMonitor", "ScaledObject"],
            {"Monitoring": POD_MONITOR_APPLIED, "Autoscaling": SCALED_OBJECT_APPLIED},
            [NP, PDB, "PodMonitor", "ScaledObject"],
            id="offline-unknown-crds-every-child",
        ),
        pytest.param(
            {"monitoring": MONITORED, "autoscaling": KEDA},
            ALL_CRDS,
            [*SCALED_KINDS, "PodMonitor", "ScaledObject"],
            {"Monitoring": POD_MONITOR_APPLIED, "Autoscaling": SCALED_OBJECT_APPLIED},
            [NP, PDB, "PodMonitor", "ScaledObject"],
            id="crds-installed",
        ),
        pytest.param(
            {"monitoring": MONITORED, "autoscaling": HPA},
            frozenset(),
            [*SCALED_KINDS, "HorizontalPodAutoscaler"],
            {"Monitoring": POD_MONITOR_MISSING, "Autoscaling": HPA_APPLIED},
            [NP, PDB, "HorizontalPodAutoscaler"],
            id="podmonitor-crd-missing-hpa-needs-none",
        ),
        pytest.param(
            {"monitoring": MONITORED, "autoscaling": KEDA},
            frozenset({PODMONITOR_CRD}),
            [*SCALED_KINDS, "PodMonitor"],
            {"Monitoring": POD_MONITOR_APPLIED, "Autoscaling": SCALED_OBJECT_MISSING},
            [NP, PDB, "PodMonitor"],
            id="keda-crd-missing",
        ),
        pytest.param(
            {"monitoring": MONITORED, "autoscaling": KEDA},
            frozenset(),
            SCALED_KINDS,
            {"Monitoring": POD_MONITOR_MISSING, "Autoscaling": SCALED_OBJECT_MISSING},
            [NP, PDB],
            id="both-crds-missing",
        ),
        pytest.param({}, frozenset(), BASE_KINDS, {}, [NP], id="nothing-asked-no-condition"),
    ],
)
def test_optional_children_follow_installed_crds(fields, crds, applied, features, optional):
    decision = decide(observed(crds, spec=spec(**fields)), T0)
    assert kinds(decision) == applied
    found = conditions(decision)
    assert list(found) == ["Planned", "Ready", *features]
    assert found["Planned"][:2] == ("True", "Planned")
    assert found["Ready"] == ("False", "Progressing", "0/1 replicas ready")
    assert {k: v for k, v in found.items() if k not in ("Planned", "Ready")} == features
    assert decision.status["optionalChildren"] == optional
    assert decision.obsolete == ()
    for cond in decision.status["conditions"]:
        assert (cond["observedGeneration"], cond["lastTransitionTime"]) == (3, T0_TEXT)


def test_missing_crd_leaves_planned_and_ready_as_without_the_feature():
    ready = {"status": {"replicas": 1, "readyReplicas": 1}}
    plain = decide(observed(frozenset(), deployment=ready), T0)
    missing = decide(observed(frozenset(), deployment=ready, spec=spec(monitoring=MONITORED, autoscaling=KEDA)), T0)
    assert missing.status["conditions"][:2] == plain.status["conditions"]
    assert conditions(missing)["Ready"] == ("True", "Available", "1/1 replicas ready")
    assert [(e.type, e.reason) for e in missing.events] == [
        ("Normal", "Planned"),
        ("Normal", "Available"),
        ("Warning", "PodMonitorCRDMissing"),
        ("Warning", "ScaledObjectCRDMissing"),
    ]


def _gone(kind: str, api_version: str) -> dict[str, str]:
    return {"apiVersion": api_version, "kind": kind, "name": "llama", "namespace": "serving"}


HPA_GONE = _gone("HorizontalPodAutoscaler", "autoscaling/v2")
PODMONITOR_GONE = _gone("PodMonitor", "monitoring.coreos.com/v1")
SCALEDOBJECT_GONE = _gone("ScaledObject", "keda.sh/v1alpha1")


ROUTER_REFS = ["Service/llama-servers", "ConfigMap/llama-router", "Deployment/llama-router"]
ROUTER_GONE = (
    {**_gone("Service", "v1"), "name": "llama-servers"},
    {**_gone("ConfigMap", "v1"), "name": "llama-router"},
    {**_gone("Deployment", "apps/v1"), "name": "llama-router"},
)
PDB_GONE = _gone(PDB, "policy/v1")


@pytest.mark.parametrize(
    ("before", "fields", "crds", "obsolete", "after"),
    [
        pytest.param(
            [NP, PDB, "HorizontalPodAutoscaler"],
            {"autoscaling": KEDA},
            ALL_CRDS,
            (HPA_GONE,),
            [NP, PDB, "ScaledObject"],
            id="hpa-to-keda",
        ),
        pytest.param(
            [NP, PDB, "ScaledObject"],
            {"autoscaling": HPA},
            ALL_CRDS,
            (SCALEDOBJECT_GONE,),
            [NP, PDB, "HorizontalPodAutoscaler"],
            id="keda-to-hpa",
        ),
        pytest.param(
            [NP, PDB, "PodMonitor", "HorizontalPodAutoscaler"],
            {"autoscaling": HPA},
            ALL_CRDS,
            (PODMONITOR_GONE,),
            [NP, PDB, "HorizontalPodAutoscaler"],
            id="monitoring-removed",
        ),
        pytest.param(
            [NP, PDB, "PodMonitor", "ScaledObject"],
            {},
            ALL_CRDS,
            (PDB_GONE, PODMONITOR_GONE, SCALEDOBJECT_GONE),
            [NP],
            id="everything-removed",
        ),
        pytest.param(
            [NP, "PodMonitor"],
            {"monitoring": MONITORED},
            frozenset(),
            (PODMONITOR_GONE,),
            [NP],
            id="crd-uninstalled",
        ),
        pytest.param(
            [NP, PDB, "PodMonitor", "HorizontalPodAutoscaler"],
            {"monitoring": MONITORED, "autoscaling": HPA},
            ALL_CRDS,
            (),
            [NP, PDB, "PodMonitor", "HorizontalPodAutoscaler"],
            id="unchanged",
        ),
        pytest.param(
            [*ROUTER_REFS, PDB],
            {"replicas": 2, "routing": {"mode": "service"}},
            ALL_CRDS,
            ROUTER_GONE,
            [NP, PDB],
            id="router-to-service",
        ),
        pytest.param(
            ["Deployment", "Service", "ConfigMap/llama-launcher", "Unknown", "Unknown/x"],
            {},
            ALL_CRDS,
            (),
            [NP],
            id="kept-and-unknown-never-deleted",
        ),
        pytest.param(None, {"monitoring": MONITORED}, ALL_CRDS, (), [NP, "PodMonitor"], id="no-record-before"),
    ],
)
def test_obsolete_lists_kinds_applied_before_and_no_longer_asked_for(before, fields, crds, obsolete, after):
    status = {"optionalChildren": before} if before is not None else {}
    decision = decide(observed(crds, status=status, spec=spec(**fields)), T0)
    assert decision.obsolete == obsolete
    assert decision.status["optionalChildren"] == after
    assert ("optionalChildren" in decision.status_patch) == (before != after)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"nodes": ()}, id="no-node"),
        pytest.param({"spec": InvalidSpec("spec.replicas: bad"), "model": None}, id="invalid-spec"),
        pytest.param({"apply_error": ChildRejected("refused")}, id="apply-error"),
    ],
)
def test_nothing_obsolete_and_record_kept_when_the_plan_fails(fields):
    status = {"optionalChildren": [NP, "PodMonitor", "HorizontalPodAutoscaler"]}
    decision = decide(observed(ALL_CRDS, status=status, **fields), T0)
    assert decision.obsolete == ()
    assert decision.children == ()
    assert decision.status["optionalChildren"] == [NP, "PodMonitor", "HorizontalPodAutoscaler"]
    assert "optionalChildren" not in decision.status_patch
    assert [c["type"] for c in decision.status["conditions"]] == ["Planned", "Ready"]


def test_terminating_namespace_deletes_nothing():
    status = {"optionalChildren": [NP, "PodMonitor"]}
    decision = decide(observed(ALL_CRDS, status=status, namespace=NamespaceFacts(terminating=True)), T0)
    assert decision == Decision(outcome=None)


# --- reconcile -----------------------------------------------------------------------------------------------


def reconciler() -> tuple[Reconciler, RecordingKube]:
    kube = RecordingKube()
    return Reconciler(kube, StubHub(), clock=lambda: T0), kube


def writes(kube: RecordingKube, verb: str) -> list[tuple[str, ...]]:
    return [call for call in kube.calls if call[0] == verb]


BASE_APPLIES = [
    ("apply", "networking.k8s.io/v1", NP),
    ("apply", "v1", "ConfigMap"),
    ("apply", "v1", "Service"),
    ("apply", "apps/v1", "Deployment"),
]


@pytest.mark.parametrize(
    ("first", "second", "applied", "deleted", "optional"),
    [
        pytest.param(
            {"autoscaling": HPA},
            {"autoscaling": KEDA},
            [("apply", "keda.sh/v1alpha1", "ScaledObject")],
            [("delete", "autoscaling/v2", "HorizontalPodAutoscaler", "serving", "llama")],
            [NP, PDB, "ScaledObject"],
            id="hpa-to-keda",
        ),
        pytest.param(
            {"monitoring": MONITORED, "autoscaling": HPA},
            {"autoscaling": HPA},
            [],  # the HPA is unchanged: not written again
            [("delete", "monitoring.coreos.com/v1", "PodMonitor", "serving", "llama")],
            [NP, PDB, "HorizontalPodAutoscaler"],
            id="monitoring-removed",
        ),
        pytest.param(
            {"monitoring": MONITORED, "autoscaling": KEDA},
            {},
            [],
            [  # the autoscaler before the writes (none here), the others after them
                ("delete", "keda.sh/v1alpha1", "ScaledObject", "serving", "llama"),
                ("delete", "policy/v1", PDB, "serving", "llama"),
                ("delete", "monitoring.coreos.com/v1", "PodMonitor", "serving", "llama"),
            ],
            [NP],
            id="everything-removed",
        ),
    ],
)
def test_reconcile_deletes_obsolete_children_once(first, second, applied, deleted, optional):
    rec, kube = reconciler()
    rec.reconcile(service(first), ClusterView(nodes=NODES, installed_crds=ALL_CRDS))
    assert writes(kube, "delete") == []
    first_status = kube.status_patches[-1]

    kube.calls.clear()
    rec.reconcile(service(second, status=first_status), ClusterView(nodes=NODES, installed_crds=ALL_CRDS))
    assert writes(kube, "apply") == applied  # the unchanged base children are not written again
    assert writes(kube, "delete") == deleted
    assert kube.status_patches[-1]["optionalChildren"] == optional

    # The watch delivers the status just written (or still the old one): nothing is deleted again.
    kube.calls.clear()
    rec.reconcile(service(second, status=kube.status_patches[-1]), ClusterView(nodes=NODES, installed_crds=ALL_CRDS))
    rec.reconcile(service(second, status=first_status), ClusterView(nodes=NODES, installed_crds=ALL_CRDS))
    assert writes(kube, "delete") == []


@pytest.mark.parametrize(
    ("first", "second", "first_call", "last_call"),
    [
        # KEDA's webhook refuses a ScaledObject beside an HPA of the same target: the HPA goes first.
        (
            {"autoscaling": HPA},
            {"autoscaling": KEDA},
            ("delete", "autoscaling/v2", "HorizontalPodAutoscaler", "serving", "llama"),
            ("apply", "keda.sh/v1alpha1", "ScaledObject"),
        ),
        # Through the Service again: it selects the servers, and their policy admits the namespace, before the
        # router and its policy go (no moment with the Service pointing at pods on their way out).
        (
            {"routing": {"mode": "router"}},
            {"routing": {"mode": "service"}},
            ("apply", "networking.k8s.io/v1", NP),
            ("delete", "apps/v1", "Deployment", "serving", "llama-router"),
        ),
    ],
    ids=["autoscaler-replaced", "router-removed"],
)
def test_an_obsolete_child_goes_before_the_writes_only_when_its_successor_would_be_refused(
    first, second, first_call, last_call
):
    rec, kube = reconciler()
    rec.reconcile(service(first), ClusterView(nodes=NODES, installed_crds=ALL_CRDS))
    kube.calls.clear()
    rec.reconcile(service(second, status=kube.status_patches[-1]), ClusterView(nodes=NODES, installed_crds=ALL_CRDS))
    order = [call for call in kube.calls if call[0] in ("apply", "delete")]
    assert (order[0], order[-1]) == (first_call, last_call), order
    kinds = [call[0] for call in order]
    assert kinds == sorted(kinds, reverse=first_call[0] == "delete"), order  # deletes and writes apart, not mixed


def test_a_restarted_operator_deletes_from_the_objects_own_status():
    """After a restart nothing was written by this process: the object's status.optionalChildren is the record."""
    rec, kube = reconciler()
    rec.reconcile(
        service({}, status={"optionalChildren": [NP, "HorizontalPodAutoscaler"]}),
        ClusterView(nodes=NODES, installed_crds=ALL_CRDS),
    )
    assert writes(kube, "delete") == [("delete", "autoscaling/v2", "HorizontalPodAutoscaler", "serving", "llama")]
    assert kube.status_patches[-1]["optionalChildren"] == [NP]


def test_a_refused_plan_deletes_nothing():
    rec, kube = reconciler()
    status = {"optionalChildren": [NP, "PodMonitor"]}
    outcome = rec.reconcile(
        service({"cpu": {"requiredISA": ["sve"]}}, status=status), ClusterView(nodes=NODES, installed_crds=ALL_CRDS)
    )
    assert isinstance(outcome, NoEligibleNode)
    assert writes(kube, "apply") == writes(kube, "delete") == []
    assert "optionalChildren" not in kube.status_patches[-1]


def test_missing_crd_is_reported_once_and_not_applied():
    rec, kube = reconciler()
    fields = {"monitoring": MONITORED}
    rec.reconcile(service(fields), ClusterView(nodes=NODES, installed_crds=frozenset()))
    assert writes(kube, "apply") == BASE_APPLIES
    assert ("event", "Warning", "PodMonitorCRDMissing") in kube.calls
    (patch,) = kube.status_patches
    assert patch["optionalChildren"] == [NP]

    # The CRD gets installed (optional_api_changed reconciles again): the PodMonitor is applied, the condition flips.
    kube.calls.clear()
    rec.reconcile(service(fields, status=patch), ClusterView(nodes=NODES, installed_crds=ALL_CRDS))
    assert writes(kube, "apply") == [("apply", "monitoring.coreos.com/v1", "PodMonitor")]
    assert writes(kube, "event") == [("event", "Normal", "PodMonitorApplied")]
    assert kube.status_patches[-1]["optionalChildren"] == [NP, "PodMonitor"]


def test_switching_hpa_to_keda_survives_the_keda_webhook():
    rec, kube = reconciler()
    rec.reconcile(service({"autoscaling": HPA}), ClusterView(nodes=NODES, installed_crds=ALL_CRDS))
    first_status = kube.status_patches[-1]
    kube.calls.clear()
    hpa_alive = True
    applied = kube.apply
    deleted = kube.delete

    def apply(manifest, over):
        if manifest["kind"] == "ScaledObject" and hpa_alive:
            raise PermissionDenied(
                'forbidden to apply ScaledObject serving/llama: admission webhook "vscaledobject.kb.io" denied '
                "the request: the workload 'llama' of type 'cpullm.io/v1alpha1.CpuLLMService' is already managed "
                "by the hpa 'llama'"
            )
        return applied(manifest, over)

    def delete(api_version, kind, namespace, name, owner_uid):
        nonlocal hpa_alive
        hpa_alive = hpa_alive and kind != "HorizontalPodAutoscaler"
        deleted(api_version, kind, namespace, name, owner_uid)

    kube.apply, kube.delete = apply, delete
    for _ in range(2):  # the first attempt and one retry
        rec.reconcile(
            service({"autoscaling": KEDA}, status=first_status), ClusterView(nodes=NODES, installed_crds=ALL_CRDS)
        )
    assert writes(kube, "delete") == [("delete", "autoscaling/v2", "HorizontalPodAutoscaler", "serving", "llama")]
    assert ("apply", "keda.sh/v1alpha1", "ScaledObject") in writes(kube, "apply")
    assert kube.status_patches[-1]["optionalChildren"] == [NP, PDB, "ScaledObject"]


def test_every_status_field_written_is_declared_in_the_crd():
    status = decide(observed(ALL_CRDS, spec=spec(monitoring=MONITORED, autoscaling=HPA)), T0).status
    declared = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert set(status) - set(declared["properties"]) == set()
    optional = declared["properties"]["optionalChildren"]
    assert (optional["type"], optional["items"]) == ("array", {"type": "string"})
