"""The CpuLLMService status, computed purely from what reconcile saw. The clock is an argument.

Conditions:
- Planned: True when the spec was planned on the current nodes; False names the refusal (NoEligibleNode,
  ModelTooLarge, InvalidTensorParallelSize, KVCacheTooSmall, ModelConfigUnavailable, InvalidSpec, ...).
- Ready: True when every desired replica is ready (or none is desired); False says why (the plan failed, pods
  cannot be created, with the ReplicaSet's message, a pod cannot be scheduled, with the scheduler's own message,
  or pods are still starting).
- NUMAAligned, NativeBF16 (core/cautions.py): present (False, a Warning event) only while the plan runs slower
  than the nodes or the model allow, with what to change.
- FixesLoaded (core/server_exits.py): present (False, a Warning event) only while a server pod's last end reports a
  fix the plan counts on as not loaded.
- RolloutPaced: present (True) only while the servers' new pod template waits for a rollout slot
  (core/rollout.py): the servers run the current one meanwhile.
On a failed plan the last good plan stays in status.plan: it is what the Deployment still runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cpullm.api.plan import Plan
from cpullm.core.children.common import SERVICE_LABEL
from cpullm.core.pod_troubles import PodTrouble
from cpullm.errors import CpuLLMError

PLANNED = "Planned"
READY = "Ready"
PROGRESSING = "Progressing"  # Ready's reason while pods start
ROLLOUT_PACED = "RolloutPaced"
# The kinds of optional children (PodMonitor, HPA, ScaledObject) last applied: what to delete when the spec
# stops asking for one.
OPTIONAL_CHILDREN = "optionalChildren"


def condition(
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    now: datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A metav1.Condition; lastTransitionTime moves only when the status flips."""
    status = "True" if ok else "False"
    old = next((c for c in previous if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since or now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


@dataclass(frozen=True)
class FeatureCondition:
    """A condition for an optional part the spec asked for (Monitoring, Autoscaling): applied, or why not."""

    type: str
    ok: bool
    reason: str
    message: str


def replica_counts(deployment_status: Mapping[str, Any] | None) -> tuple[int, int]:
    """(replicas, readyReplicas) of a Deployment's status."""
    deployment_status = deployment_status or {}
    return int(deployment_status.get("replicas") or 0), int(deployment_status.get("readyReplicas") or 0)


def pod_creation_failure(deployment_status: Mapping[str, Any] | None) -> str | None:
    """Why the Deployment's ReplicaSet cannot create pods (its ReplicaFailure condition: a quota exceeded, an
    admission webhook or policy refusing the pod, an invalid image reference), None when it can."""
    for cond in (deployment_status or {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return str(cond.get("message") or cond.get("reason") or "the ReplicaSet cannot create its pods")
    return None


def deployment_facts(deployment_status: Mapping[str, Any] | None) -> tuple[int, int, str | None]:
    """All of a Deployment's status that the service's status reports: its replica counts and why its pods
    cannot be created. A change of any of them needs a reconcile; the Deployment's other status updates do not."""
    return (*replica_counts(deployment_status), pod_creation_failure(deployment_status))


def compute_status(
    *,
    name: str,
    generation: int,
    desired_replicas: int,
    outcome: Plan | CpuLLMError,
    deployment_status: Mapping[str, Any] | None,
    previous: Mapping[str, Any],
    now: datetime,
    features: Sequence[FeatureCondition] = (),
    optional_children: Sequence[str] | None = None,
    trouble: PodTrouble | None = None,
) -> dict[str, Any]:
    """`optional_children`: the kinds of optional children applied (None: as before, the plan failed); `trouble`:
    why one of the service's pods cannot start or keep running (core/pod_troubles.py)."""
    conditions = previous.get("conditions") or []
    replicas, ready = replica_counts(deployment_status)

    if isinstance(outcome, Plan):
        plan: Any = outcome.model_dump(by_alias=True, mode="json", exclude_none=True)
        planned = condition(PLANNED, True, "Planned", outcome.summary, generation, now, conditions)
        if desired_replicas == 0:
            ready_ok, reason, message = True, "ScaledToZero", "no replicas requested"
        elif ready >= desired_replicas:
            ready_ok, reason, message = True, "Available", f"{ready}/{desired_replicas} replicas ready"
        elif failure := pod_creation_failure(deployment_status):
            ready_ok, reason = False, "FailedCreate"
            message = f"{ready}/{desired_replicas} replicas ready; pods cannot be created: {failure}"
        elif trouble:
            ready_ok, reason = False, trouble.reason
            message = f"{ready}/{desired_replicas} replicas ready; {trouble.message}"
        else:
            ready_ok, reason, message = False, PROGRESSING, f"{ready}/{desired_replicas} replicas ready"
    else:
        plan = previous.get("plan")
        planned = condition(PLANNED, False, outcome.reason, outcome.message, generation, now, conditions)
        kept = "; the last applied Deployment is left as it was" if plan else ""
        ready_ok, reason, message = False, outcome.reason, f"not planned: {outcome.message}{kept}"

    status: dict[str, Any] = {
        "observedGeneration": generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "selector": f"{SERVICE_LABEL}={name}",
        "conditions": [
            planned,
            condition(READY, ready_ok, reason, message, generation, now, conditions),
            *(condition(f.type, f.ok, f.reason, f.message, generation, now, conditions) for f in features),
        ],
    }
    if plan is not None:
        status["plan"] = plan
    kinds = optional_children if optional_children is not None else previous.get(OPTIONAL_CHILDREN)
    if kinds is not None:
        status[OPTIONAL_CHILDREN] = list(kinds)
    return status


def status_changes(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level status keys whose value differs: the merge patch to send, empty when nothing changed."""
    return {key: _merge_patch(current.get(key), value) for key, value in desired.items() if current.get(key) != value}


def _merge_patch(old: Any, new: Any) -> Any:
    """What a JSON merge patch must say to turn `old` into `new`: a merge patch merges objects, so a key `new` no
    longer has (a plan's note that no longer applies) is removed only by an explicit null."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch = {key: _merge_patch(old.get(key), value) for key, value in new.items()}
    patch.update({key: None for key in old if key not in new})
    return patch


def changed_conditions(current: Mapping[str, Any], desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Conditions that flipped or changed reason, and a Planned whose message (the plan) changed: what
    deserves an event. Progress counts alone ('1/2 replicas ready' -> '2/2') do not, nor does a new service's
    first Ready, Progressing: its Planned event says the rollout began, and a Warning for it would be noise."""
    before = {c.get("type"): c for c in current.get("conditions") or []}
    if READY not in before:
        before[READY] = {"type": READY, "status": "False", "reason": PROGRESSING}

    def key(cond: Mapping[str, Any]) -> tuple[Any, ...]:
        return (cond.get("status"), cond.get("reason")) + (
            (cond.get("message"),) if cond.get("type") == PLANNED else ()
        )

    return [c for c in desired.get("conditions") or [] if key(before.get(c["type"], {"type": c["type"]})) != key(c)]
