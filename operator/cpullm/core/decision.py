"""Decide: from everything one reconcile observed to what should be, purely (no API calls, no clock but the
one passed in, no randomness). The operator's reconcile and the CLI's `plan`/`render` both call `decide`, so
what is rendered offline is what the operator applies.

    Observed --decide(now)--> Decision(outcome, children, status, status patch, events)

Refusals are checked in this order, the most fundamental first: the spec itself, the namespace's Pod
Security level, the model's config, the plan (nodes and sizing), and last what the API server said when
the children were applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import API_VERSION, KIND, CpuLLMServiceSpec
from cpullm.core.children import CHILD_KIND, OPTIONAL_APIS, build_children, child_of_ref, child_ref, kept_refs
from cpullm.core.children.common import Owner
from cpullm.core.children.model_cache import node_cache_paths
from cpullm.core.children.network_policy import admit_callers, admit_operator
from cpullm.core.children.sizing_job import STATUS_KEY, build_sizing_job
from cpullm.core.gateway import gateway_peer
from cpullm.core.observation import Observed
from cpullm.core.planner import plan_service
from cpullm.core.podsecurity import enforced_level, server_security
from cpullm.core.rollout import UNPACED_LABEL, RolloutCause, is_servers_deployment, rollout_cause
from cpullm.core.server_exits import fixes_loaded_condition
from cpullm.core.sizing import ModelSize
from cpullm.core.status import (
    OPTIONAL_CHILDREN,
    ROLLOUT_PACED,
    FeatureCondition,
    changed_conditions,
    compute_status,
    status_changes,
)
from cpullm.errors import CpuLLMError, SizingWithVllm


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    """What should be. `outcome` is None when nothing may be done (the namespace is being deleted)."""

    outcome: Plan | CpuLLMError | None
    children: tuple[dict[str, Any], ...] = ()
    status: Mapping[str, Any] = field(default_factory=dict)
    status_patch: Mapping[str, Any] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    # Optional children applied before that the spec no longer asks for: {apiVersion, kind, name, namespace}.
    obsolete: tuple[dict[str, str], ...] = ()
    # The children roll the servers out for a change their user did not ask for: a rollout slot is needed first.
    paced_rollout: bool = False
    # The Job that has vLLM size the model (core/children/sizing_job.py), created where none asks yet.
    sizing_job: dict[str, Any] | None = None

    def obsolete_deleted(self, before_writes: bool) -> tuple[dict[str, str], ...]:
        """The obsolete children deleted before the writes, or after them (ChildKind.deleted_before_writes)."""
        return tuple(c for c in self.obsolete if CHILD_KIND[c["kind"]].deleted_before_writes is before_writes)


def regarding(owner: Owner) -> dict[str, Any]:
    """The object reference events about a service carry."""
    return {"apiVersion": API_VERSION, "kind": KIND, "name": owner.name, "namespace": owner.namespace, "uid": owner.uid}


def decide_plan(observed: Observed) -> Plan | CpuLLMError:
    """The plan, or the most fundamental reason there is none."""
    spec = observed.spec
    if isinstance(spec, CpuLLMError):
        return spec
    try:
        level = enforced_level(observed.namespace.labels)
        security = server_security(spec, level, observed.policy.numa_seccomp_profile, observed.owner.namespace)
        if isinstance(observed.model, CpuLLMError):
            return observed.model
        if observed.model is None:
            raise ValueError("decide_plan needs the model's size: gather resolves it for a valid spec")
        plan = plan_service(
            spec,
            observed.model,
            observed.nodes,
            observed.status.get("plan"),
            observed.daemons,
            router_image=observed.policy.router_image,
            vllm_images=observed.policy.vllm_images,
        ).model_copy(update={"security": security})
        if spec.model_cache and spec.model_cache.node_local:
            paths = node_cache_paths(
                observed.policy.node_cache_dir, observed.namespace.uid, observed.owner.uid, spec.model
            )
            plan = plan.model_copy(update={"node_cache_path": paths.weights, "node_compile_cache_path": paths.compiled})
        return plan
    except CpuLLMError as refusal:
        return refusal


def _optional_parts(
    observed: Observed, children: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[FeatureCondition], list[str]]:
    """(children to apply, a condition per feature the spec asked for, the optional children applied as
    status.optionalChildren names them): a child whose CRD is not installed is left out and its condition says
    what to install; two kinds under one condition (an InferencePool and its HTTPRoute) share it, False first."""
    applied, refs = [], []
    features: dict[str, FeatureCondition] = {}
    for child in children:
        kind = CHILD_KIND[child["kind"]]
        crd = OPTIONAL_APIS.get((kind.api_version, kind.kind))
        if crd is not None and observed.installed_crds is not None and crd not in observed.installed_crds:
            message = (
                f"the {kind.kind} API ({kind.api_version}) is not installed: install {kind.installer} (CRD {crd}); "
                f"the {kind.kind} is applied as soon as it is"
            )
            feature = FeatureCondition(kind.condition or kind.kind, False, f"{kind.kind}CRDMissing", message)
        else:
            applied.append(child)
            ref = child_ref(child, observed.owner)
            if ref not in kept_refs(observed.owner):
                refs.append(ref)
            if kind.condition is None:
                continue
            feature = FeatureCondition(
                kind.condition, True, f"{kind.kind}Applied", f"{kind.kind} {child['metadata']['name']}"
            )
        features[feature.type] = _joined(features.get(feature.type), feature)
    return applied, list(features.values()), refs


def _joined(first: FeatureCondition | None, then: FeatureCondition) -> FeatureCondition:
    if first is None:
        return then
    if first.ok != then.ok:
        return first if not first.ok else then
    return FeatureCondition(first.type, first.ok, first.reason, f"{first.message}; {then.message}")


def _servers(children: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    return next((c for c in children if is_servers_deployment(c)), None)


def _background_rollout(observed: Observed, children: Sequence[dict[str, Any]]) -> bool:
    """Whether applying `children` rolls the servers out for a change their user did not ask for, and is paced: an
    administrator lets the rollouts of a namespace through by labelling it (UNPACED_LABEL; tenants who may edit
    their services cannot edit their Namespace)."""
    servers = _servers(children)
    if servers is None or observed.namespace.labels.get(UNPACED_LABEL) == "true":
        return False
    cause = rollout_cause(observed.deployment, servers, observed.generation, observed.status.get("observedGeneration"))
    return cause is RolloutCause.BACKGROUND


def _paced(observed: Observed, children: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], FeatureCondition | None]:
    """(the children to apply, the RolloutPaced condition): while no rollout slot is free for a change the user did
    not ask for, the servers' Deployment is left as it is and the condition says why."""
    if not (observed.rollout_held and _background_rollout(observed, children)):
        return children, None
    limit = observed.policy.max_concurrent_rollouts
    message = (
        f"the servers' new pod template waits for a rollout slot: at most {limit} services roll out at once for "
        "changes their spec did not ask for (an operator upgrade, an admin setting, a node's facts); they serve "
        "the current template meanwhile"
    )
    servers = _servers(children)
    return [c for c in children if c is not servers], FeatureCondition(ROLLOUT_PACED, True, ROLLOUT_PACED, message)


def decide(observed: Observed, now: datetime) -> Decision:
    if observed.namespace.terminating:
        return Decision(outcome=None)
    outcome = decide_plan(observed)
    children: tuple[dict[str, Any], ...] = ()
    features: list[FeatureCondition] = []
    optional_kinds: list[str] | None = None
    obsolete: tuple[dict[str, str], ...] = ()
    if isinstance(outcome, Plan) and isinstance(observed.spec, CpuLLMServiceSpec):
        built = build_children(observed.owner, observed.spec, outcome)
        admit_operator(built, observed.owner, observed.spec.service.port, observed.policy.operator_peer)
        if observed.gateways and observed.spec.network_policy.allowed_from is not None:  # else its namespace's pods
            admit_callers(built, observed.owner, observed.spec, outcome, [gateway_peer(observed.gateways)])
        built, paced = _paced(observed, built)
        wanted, features, optional_kinds = _optional_parts(observed, built)
        features += [paced] if paced else []
        features += [FeatureCondition(c.condition, False, c.reason, c.message) for c in outcome.cautions or []]
        fixes = fixes_loaded_condition(observed.server_exits, outcome.fixes_credited)
        features += [fixes] if fixes else []
        features += [observed.performance.condition()] if observed.performance else []
        children = tuple(wanted)
        before = observed.status.get(OPTIONAL_CHILDREN) or []
        kept = kept_refs(observed.owner)
        gone = [child_of_ref(r, observed.owner) for r in before if r not in optional_kinds and r not in kept]
        obsolete = tuple(child for child in gone if child is not None)
        if observed.apply_error is not None:
            outcome, children, features, optional_kinds, obsolete = observed.apply_error, (), [], None, ()
    if isinstance(outcome, SizingWithVllm) and observed.apply_error is not None:
        outcome = observed.apply_error  # the sizing Job was refused
    if isinstance(outcome, Plan):
        desired_replicas = outcome.replicas  # what the plan could place (throughput placement caps it)
    elif isinstance(observed.spec, CpuLLMServiceSpec):
        desired_replicas = observed.spec.replicas
    else:
        desired_replicas = observed.requested_replicas
    status = compute_status(
        name=observed.owner.name,
        generation=observed.generation,
        desired_replicas=desired_replicas,
        outcome=outcome,
        deployment_status=(observed.deployment or {}).get("status"),
        previous=observed.status,
        now=now,
        features=features,
        optional_children=optional_kinds,
        trouble=observed.pod_trouble,
    )
    sizing_job = _sizing(observed, outcome, status)
    events = tuple(
        Event("Normal" if cond["status"] == "True" else "Warning", cond["reason"], cond["message"])
        for cond in changed_conditions(observed.status, status)
    )
    return Decision(
        outcome=outcome,
        children=children,
        status=status,
        status_patch=status_changes(observed.status, status),
        events=events,
        obsolete=obsolete,
        paced_rollout=_background_rollout(observed, children),
        sizing_job=sizing_job,
    )


def _sizing(observed: Observed, outcome: Plan | CpuLLMError, status: dict[str, Any]) -> dict[str, Any] | None:
    """Keeps vLLM's answer in status.vllmSizing (dropped once a model is sized without it), and returns the sizing
    Job to create where vLLM is to be asked."""
    record = observed.sizing.record
    if record is not None:
        status[STATUS_KEY] = dict(record)
    elif isinstance(observed.model, ModelSize) and observed.status.get(STATUS_KEY) is not None:
        status[STATUS_KEY] = None  # a merge patch's removal
    request = observed.sizing.request
    if isinstance(outcome, SizingWithVllm) and request is not None and isinstance(observed.spec, CpuLLMServiceSpec):
        return build_sizing_job(observed.owner, observed.spec, request)
    return None
