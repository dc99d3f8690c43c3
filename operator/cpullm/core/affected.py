"""Whether an event about another object can change a service: pure, so each watch reconciles only the
services it can affect (with thousands of services, one node's label change must not touch them all)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from cpullm.api.crd import parse_stored_spec
from cpullm.api.plan import Plan
from cpullm.core.children import CHILD_KINDS
from cpullm.core.children.common import controlling_service
from cpullm.core.eligibility import Needs, node_rejection
from cpullm.core.topology import NodeProfile, NodeState
from cpullm.errors import CpuLLMError


def affected_by_node(service: Mapping[str, Any], node: str, before: NodeState, after: NodeState) -> bool:
    """Whether a change of `node` can change this service's plan: the node is among the nodes it is planned on,
    or could run it before or after the change. Any other node is irrelevant to it, so the other services are
    not even re-planned (with thousands of services, one node's label change must not touch them all)."""
    plan = (service.get("status") or {}).get("plan") or {}
    if node in (plan.get("eligibleNodes") or []):
        return True
    try:
        needs = Needs.of(parse_stored_spec(service.get("spec")))
    except CpuLLMError:
        return True  # its reconcile reports the spec; nothing to save here
    return any(isinstance(p, NodeProfile) and node_rejection(needs, p) is None for p in (before, after))


def asks_for_api(service: Mapping[str, Any], crd: str) -> bool:
    """Whether the service asks for a child of the optional API this CRD serves (a PodMonitor, an InferencePool),
    as its spec and last plan (status.plan) say: each optional kind's `wanted`, without building the children. A
    service with no plan has nothing to apply."""
    plan = (service.get("status") or {}).get("plan")
    if not plan:
        return False
    try:
        spec, planned = parse_stored_spec(service.get("spec")), Plan.model_validate(plan)
    except (CpuLLMError, ValidationError):
        return True  # its reconcile reports what is wrong; nothing to save here
    return any(kind.crd == crd and kind.wanted is not None and kind.wanted(spec, planned) for kind in CHILD_KINDS)


def owning_service(
    namespace: str, meta: Mapping[str, Any], services: Mapping[tuple[str, str], Iterable[Mapping[str, Any]]]
) -> Mapping[str, Any] | None:
    """The service an owned child's event concerns: the one its controller owner reference names, name and UID,
    among `services` (keyed by namespace and name). None for an object that merely carries the operator's labels,
    or that a deleted service of the same name left behind."""
    controller = controlling_service(meta)
    if controller is None:
        return None
    name, uid = controller
    return next((s for s in services.get((namespace, name), ()) if (s.get("metadata") or {}).get("uid") == uid), None)
