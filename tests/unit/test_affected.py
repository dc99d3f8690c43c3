"""Which services an event about another object can change (core/affected.py)."""

from __future__ import annotations

from typing import Any

import pytest

from cpullm.api.plan import Plan
from cpullm.api.spec import parse_spec
from cpullm.core.affected import affected_by_node, asks_for_api, owning_service
from cpullm.core.children import CHILD_KINDS, OPTIONAL_APIS, build_children
from cpullm.core.children.common import Owner, metadata
from cpullm.errors import NodeLabelError

from .builders import node, planned_service

POD_MONITOR_CRD = next(crd for (_, kind), crd in OPTIONAL_APIS.items() if kind == "PodMonitor")
SCALED_OBJECT_CRD = next(crd for (_, kind), crd in OPTIONAL_APIS.items() if kind == "ScaledObject")
INFERENCE_POOL_CRD = next(crd for (_, kind), crd in OPTIONAL_APIS.items() if kind == "InferencePool")
HTTP_ROUTE_CRD = next(crd for (_, kind), crd in OPTIONAL_APIS.items() if kind == "HTTPRoute")


def service(planned_on: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"spec": {"model": {"name": "m"}, "kvCacheGiB": 1, **spec}}
    if planned_on is not None:
        body["status"] = {"plan": {"eligibleNodes": planned_on}}
    return body


@pytest.mark.parametrize(
    ("svc", "before", "after", "affected"),
    [
        (service(["n1"]), node("n1"), None, True),  # a node it is planned on went
        (service([]), None, node("n1"), True),  # a new node it could run on
        (service([], nodeSelector={"pool": "a"}), None, node("n1"), False),  # a new node it cannot run on
        (service([], nodeSelector={"pool": "a"}), node("n1"), node("n1", labels={"pool": "a"}), True),  # now it can
        (service([], nodeSelector={"pool": "a"}), None, NodeLabelError("bad"), False),  # unusable either way
        (service([], affinity={"nodeAffinity": "no"}), None, node("n1"), True),  # its reconcile reports the spec
    ],
)
def test_a_node_event_affects_the_services_it_can_change(svc, before, after, affected):
    assert affected_by_node(svc, "n1", before, after) is affected


POOL = {"mode": "inferencePool", "inferencePool": {"endpointPicker": "epp"}}


@pytest.mark.parametrize(
    ("fields", "crd", "asks"),
    [
        ({"monitoring": {"podMonitor": True}}, POD_MONITOR_CRD, True),
        ({"monitoring": {"podMonitor": False}}, POD_MONITOR_CRD, False),
        ({"autoscaling": {"kind": "keda", "maxReplicas": 2, "prometheusAddress": "http://p"}}, SCALED_OBJECT_CRD, True),
        ({"autoscaling": {"kind": "hpa", "maxReplicas": 2}}, SCALED_OBJECT_CRD, False),
        ({"monitoring": {"podMonitor": True}}, SCALED_OBJECT_CRD, False),
        ({"routing": POOL}, INFERENCE_POOL_CRD, True),
        ({"routing": POOL}, HTTP_ROUTE_CRD, False),  # no Gateway named: no HTTPRoute
        ({"routing": {**POOL, "inferencePool": {"endpointPicker": "epp", "gateway": "gw"}}}, HTTP_ROUTE_CRD, True),
        ({"routing": {"mode": "router"}}, INFERENCE_POOL_CRD, False),
    ],
)
def test_an_optional_api_matters_to_the_services_that_ask_for_its_child(fields, crd, asks):
    assert asks_for_api(planned_service(**fields), crd) is asks


def test_a_service_without_a_plan_asks_for_nothing_and_a_broken_one_is_reconciled():
    unplanned = {**planned_service(monitoring={"podMonitor": True}), "status": {}}
    assert asks_for_api(unplanned, POD_MONITOR_CRD) is False
    broken = {**planned_service(), "spec": {"replicas": "many"}}
    assert asks_for_api(broken, POD_MONITOR_CRD) is True


SERVICE_A = {"metadata": {"name": "a", "namespace": "ns", "uid": "uid-a"}}
A_CHILD = metadata(Owner("a", "ns", "uid-a"))  # what the builders write


def refs(**ref: Any) -> dict[str, Any]:
    base = {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "CpuLLMService",
        "name": "a",
        "uid": "uid-a",
        "controller": True,
    }
    return {**A_CHILD, "ownerReferences": [{**base, **ref}]}


@pytest.mark.parametrize(
    ("meta", "owner"),
    [
        (A_CHILD, SERVICE_A),
        (refs(apiVersion="cpullm.io/v1"), SERVICE_A),  # another version of the same API
        ({**A_CHILD, "ownerReferences": []}, None),  # the operator's labels alone
        (refs(uid="uid-old"), None),  # a service of that name deleted since
        (refs(name="b"), None),  # a service that does not exist
        (refs(controller=False), None),  # owned, not controlled
        (refs(kind="ReplicaSet"), None),
        (refs(apiVersion="example.com/v1"), None),
    ],
)
def test_a_child_belongs_to_the_service_its_controller_reference_names_by_uid(meta, owner):
    assert owning_service("ns", meta, {("ns", "a"): [SERVICE_A]}) == owner
    assert owning_service("other", meta, {("ns", "a"): [SERVICE_A]}) is None  # owners are in the child's namespace


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"monitoring": {"podMonitor": True}},
        {"autoscaling": {"kind": "keda", "maxReplicas": 2, "prometheusAddress": "http://p"}},
        {"autoscaling": {"kind": "hpa", "maxReplicas": 2}},
        {"routing": POOL},
        {"routing": {**POOL, "inferencePool": {"endpointPicker": "epp", "gateway": "gw"}}},
    ],
)
def test_each_optional_kind_is_wanted_exactly_where_its_builder_builds_one(fields):
    """CHILD_KINDS' `wanted` (what asks_for_api reads) and the builders (what is applied) agree for every optional
    kind: the typed fact and the children are one rule."""
    service = planned_service(**fields)
    spec, plan = parse_spec(service["spec"]), Plan.model_validate(service["status"]["plan"])
    built = {child["kind"] for child in build_children(Owner("llama", "serving"), spec, plan)}
    optional = [kind for kind in CHILD_KINDS if kind.condition is not None]
    assert optional and all(kind.wanted is not None for kind in optional)
    assert {kind.kind for kind in optional if kind.wanted and kind.wanted(spec, plan)} == built & {
        kind.kind for kind in optional
    }
