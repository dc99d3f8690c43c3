"""One idempotent reconcile for a CpuLLMService, shared by create, update, resume, node and child events.

gather (controller/gather.py) -> decide (core/decision.py, pure) -> apply: server-side apply of the children,
a status patch only when the status changed, an event for each condition that changed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from cpullm.api.plan import Plan
from cpullm.controller.gather import ClusterFacts, ModelConfigSource, gather
from cpullm.core.children.common import Owner
from cpullm.core.decision import Decision, decide, regarding
from cpullm.core.status import READY
from cpullm.core.topology import NodeProfile
from cpullm.errors import (
    ChildRejected,
    CpuLLMError,
    InvalidSpec,
    PermissionDenied,
    PlanRefusal,
    TransientApiError,
)
from cpullm.metrics import PLAN_REFUSALS, RECONCILE_SECONDS, RECONCILES

log = logging.getLogger(__name__)


class KubeGateway(ClusterFacts, Protocol):
    """The API calls a reconcile makes: the reads of gather, then the writes of apply."""

    def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]: ...
    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None: ...
    def patch_service_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...
    def emit_event(self, regarding: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


class Reconciler:
    def __init__(
        self, kube: KubeGateway, hub: ModelConfigSource, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self.kube = kube
        self.hub = hub
        self.clock = clock
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # The operator is the only writer of status; what it last wrote (per object uid) is newer than a
        # watch snapshot that may not have caught up yet, and comparing against it avoids repeated patches
        # and events. Empty after a restart: the object's own status is used then.
        self._written: dict[str, Mapping[str, Any]] = {}

    def _lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """Drop what is remembered about a deleted service (its children go by garbage collection)."""
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
        self._written.pop(uid, None)

    def reconcile(
        self,
        service: Mapping[str, Any],
        nodes: Sequence[NodeProfile],
        deployment: Mapping[str, Any] | None = None,
        installed_crds: frozenset[str] | None = None,
    ) -> Plan | CpuLLMError | None:
        """Bring children and status in line with the spec; returns the plan or the error reported, or None
        when the namespace is being deleted (nothing may be created there; everything goes with it).
        `deployment` is the owned Deployment as last seen (Kopf's index), for the replica counts;
        `installed_crds` the optional APIs' CRDs installed (Kopf's index; None: unknown)."""
        meta = service["metadata"]
        started = time.monotonic()
        outcome = self._reconcile(service, nodes, deployment, installed_crds)
        label = _outcome_label(outcome)
        RECONCILES.labels(outcome=label).inc()
        RECONCILE_SECONDS.labels(outcome=label).observe(time.monotonic() - started)
        if isinstance(outcome, PlanRefusal | InvalidSpec):
            PLAN_REFUSALS.labels(reason=outcome.reason).inc()
        log.debug("%s/%s reconciled: %s", meta["namespace"], meta["name"], label)
        return outcome

    def services_by_readiness(self) -> dict[str, int]:
        """How many services the operator last reported Ready=True and Ready=False (cpullm_services)."""
        counts = {"True": 0, "False": 0}
        for status in list(self._written.values()):
            ready = next((c for c in status.get("conditions") or [] if c.get("type") == READY), None)
            if ready is not None:
                counts[ready["status"]] = counts.get(ready["status"], 0) + 1
        return counts

    def _reconcile(
        self,
        service: Mapping[str, Any],
        nodes: Sequence[NodeProfile],
        deployment: Mapping[str, Any] | None,
        installed_crds: frozenset[str] | None,
    ) -> Plan | CpuLLMError | None:
        meta = service["metadata"]
        uid = str(meta.get("uid"))
        with self._lock((meta["namespace"], meta["name"])):
            try:
                observed = gather(
                    service,
                    nodes=nodes,
                    deployment=deployment,
                    last_status=self._written.get(uid),
                    cluster=self.kube,
                    models=self.hub,
                    installed_crds=installed_crds,
                )
                decision = decide(observed, self.clock())
                try:
                    # Obsolete children go first: a new autoscaler may be refused while the old one still
                    # targets the service (KEDA's admission webhook refuses a ScaledObject beside an HPA).
                    for gone in decision.obsolete:
                        self.kube.delete(gone["apiVersion"], gone["kind"], gone["namespace"], gone["name"])
                    for child in decision.children:
                        self.kube.apply(child)
                except (ChildRejected, PermissionDenied) as err:
                    decision = decide(replace(observed, apply_error=err), self.clock())
                self._report(decision, observed.owner, uid)
            except (TransientApiError, PermissionDenied) as err:  # cannot read or report: the caller retries
                log.warning("%s/%s: %s", meta["namespace"], meta["name"], err.message)
                return err
            return decision.outcome

    def _report(self, decision: Decision, owner: Owner, uid: str) -> None:
        """Status only when it changed (compared with what was last written), an event per changed condition."""
        if decision.status_patch:
            self.kube.patch_service_status(owner.namespace, owner.name, decision.status_patch)
            self._written[uid] = decision.status
        for event in decision.events:
            log.info("%s/%s %s %s: %s", owner.namespace, owner.name, event.type, event.reason, event.message)
            self.kube.emit_event(regarding(owner), event.type, event.reason, event.message)


def _outcome_label(outcome: Plan | CpuLLMError | None) -> str:
    if outcome is None:
        return "skipped"
    if isinstance(outcome, Plan):
        return "planned"
    return "refused" if isinstance(outcome, PlanRefusal | InvalidSpec) else "retried"
