"""Which services an event about another object can change (core/affected.py)."""

from __future__ import annotations

from typing import Any

import pytest

from cpullm.core.affected import affected_by_node, asks_for_api
from cpullm.core.children import OPTIONAL_APIS
from cpullm.errors import NodeLabelError

from .builders import node

POD_MONITOR_CRD = next(crd for (_, kind), crd in OPTIONAL_APIS.items() if kind == "PodMonitor")
SCALED_OBJECT_CRD = next(crd for (_, kind), crd in OPTIONAL_APIS.items() if kind == "ScaledObject")


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


@pytest.mark.parametrize(
    ("spec", "crd", "asks"),
    [
        ({"monitoring": {"podMonitor": True}}, POD_MONITOR_CRD, True),
        ({"monitoring": {"podMonitor": False}}, POD_MONITOR_CRD, False),
        ({"autoscaling": {"kind": "keda"}}, SCALED_OBJECT_CRD, True),
        ({"autoscaling": {"kind": "hpa"}}, SCALED_OBJECT_CRD, False),
        ({"monitoring": {"podMonitor": True}}, SCALED_OBJECT_CRD, False),
    ],
)
def test_an_optional_api_matters_to_the_services_that_ask_for_its_child(spec, crd, asks):
    assert asks_for_api({"spec": spec}, crd) is asks
