"""The PodDisruptionBudget of a service that may run more than one server: a node drain evicts one server at a
time, and the others keep serving while it drains (core/children/drain.py) and its replacement starts."""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.children.common import Owner, metadata, selector

PDB_API_VERSION = "policy/v1"


def build_disruption_budget(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any] | None:
    del plan  # the budget follows what the service may scale to, not what is placed now
    if spec.most_replicas < 2:
        return None  # one server: a budget would block every node drain, or allow what it would without one
    return {
        "apiVersion": PDB_API_VERSION,
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(owner)}},
    }
