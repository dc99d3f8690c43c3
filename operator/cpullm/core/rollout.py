"""Rollouts of the servers' Deployment: which pod template change a user asked for, and which one the operator
or the cluster brought (a new operator version, an admin setting, a node's facts), and when a rollout is over.

A changed pod template restarts every server of the service, and a CPU server takes minutes to come back. A
change the user made to their own spec rolls out at once (they asked for it); a change of the other kind, which
can reach every service at the same moment, is paced: at most `OperatorPolicy.max_concurrent_rollouts` services
roll at once (controller/pacing.py admits them), the others keep serving their current template meanwhile.

The Deployment carries the digest of the pod template it was rendered with (TEMPLATE_DIGEST): a digest of the
live template would include what the API server defaults, and could never equal the rendered one.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

TEMPLATE_DIGEST = "cpullm.io/pod-template-digest"
# A Namespace label an administrator sets ("true") to let that namespace's services roll out at once, unpaced (an
# upgrade one team needs now); a label, not a spec field, so that only who may edit the Namespace can.
UNPACED_LABEL = "cpullm.io/rollouts-unpaced"


class RolloutCause(Enum):
    SPEC = "spec"  # the service's spec changed since its last reconcile: the user asked for it
    BACKGROUND = "background"  # the same spec renders another template: paced


def is_servers_deployment(child: Mapping[str, Any]) -> bool:
    """Whether a child is the servers' Deployment: the one that carries its pod template's digest."""
    return TEMPLATE_DIGEST in (child.get("metadata") or {}).get("annotations", {})


def template_digest(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:32]


def rollout_cause(
    deployment: Mapping[str, Any] | None, desired: Mapping[str, Any], generation: int, observed_generation: Any
) -> RolloutCause | None:
    """Why applying `desired` would roll the servers out, or None when it would not (no Deployment yet: a create
    restarts nothing; or the same template). `deployment` is the live one (Kopf's index entry: metadata, replicas
    and status); a live one without a digest (written by an operator version before digests) counts as changed;
    `observed_generation` is the generation the service's status last reported."""
    if deployment is None:
        return None
    live = ((deployment.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE_DIGEST)
    if live == desired["metadata"]["annotations"][TEMPLATE_DIGEST]:
        return None
    return RolloutCause.BACKGROUND if observed_generation == generation else RolloutCause.SPEC


def server_deployment_facts(
    meta: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any]
) -> dict[str, Any]:
    """What the operator keeps of the servers' Deployment (Kopf's index): its generation, template digest, replica
    count and status, in a Deployment's own shape, and its UID (whose ReplicaSets' pods are the service's)."""
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k == TEMPLATE_DIGEST}
    return {
        "metadata": {"generation": meta.get("generation"), "annotations": annotations, "uid": meta.get("uid")},
        "spec": {"replicas": spec.get("replicas")},
        "status": copy.deepcopy(dict(status)),
    }


def _given_up(status: Mapping[str, Any]) -> bool:
    """The Deployment's progress deadline passed: a rollout that cannot finish must not hold a slot for ever."""
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    return (conditions.get("Progressing") or {}).get("reason") == "ProgressDeadlineExceeded"


def _counts(deployment: Mapping[str, Any]) -> tuple[int, int, int, int, bool]:
    """(replicas wanted, updated, available, present, whether its controller observed the latest template)."""
    meta, spec, status = (deployment.get(k) or {} for k in ("metadata", "spec", "status"))
    want = int(spec.get("replicas", 1) or 0)
    updated, available, present = (
        int(status.get(k) or 0) for k in ("updatedReplicas", "availableReplicas", "replicas")
    )
    observed = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
    return want, updated, available, present, observed


def rollout_finished(deployment: Mapping[str, Any]) -> bool:
    """Whether a rollout this operator started is over: every desired replica updated and available and no old
    one left; or given up. The new pods' start counts: it is what pacing spreads out."""
    if _given_up(deployment.get("status") or {}):
        return True
    want, updated, available, present, observed = _counts(deployment)
    return observed and updated >= want and available >= want and present == updated
