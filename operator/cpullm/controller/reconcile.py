"""One idempotent reconcile for a CpuLLMService, shared by its own, node and child events.

gather (controller/gather.py) -> decide (core/decision.py, pure) -> apply: server-side apply of the children,
a status patch only when the status changed, an event for each condition that changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from cpullm.api.crd import parse_stored_spec
from cpullm.api.plan import Plan
from cpullm.api.spec import KIND
from cpullm.controller.gather import AdapterConfigSource, ClusterFacts, ModelConfigSource, as_namespace, gather
from cpullm.controller.memory import ChildKey, OperatorMemory
from cpullm.controller.owned import read_owned, write_owned
from cpullm.controller.pacing import RolloutPacer, ServiceKey
from cpullm.controller.vllm_sizing import SizingJobs
from cpullm.core.children import child_ref
from cpullm.core.children.common import SERVICE_LABEL, Owner
from cpullm.core.decision import Decision, decide, regarding
from cpullm.core.observation import (
    DEFAULT_POLICY,
    ChildSeen,
    ClusterView,
    NamespaceFacts,
    Observed,
    OperatorPolicy,
    Ownership,
)
from cpullm.core.rollout import is_servers_deployment
from cpullm.core.status import OPTIONAL_CHILDREN
from cpullm.errors import (
    ChildConflict,
    ChildRejected,
    CpuLLMError,
    InvalidSpec,
    PermissionDenied,
    PlanRefusal,
    TransientApiError,
)
from cpullm.metrics import PLAN_REFUSALS, RECONCILE_SECONDS, RECONCILES

log = logging.getLogger(__name__)
# A cluster with nothing in it (the tests' reconciles that need no nodes).
EMPTY_VIEW = ClusterView()


class KubeGateway(ClusterFacts, SizingJobs, Protocol):
    """The API calls a reconcile makes: the reads of gather, then the writes of apply."""

    def apply(self, manifest: Mapping[str, Any], over: Ownership | None) -> dict[str, Any]: ...
    def delete(self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str) -> None: ...
    def ownership(self, api_version: str, kind: str, namespace: str, name: str) -> Ownership | None: ...
    def list_owned(self, kind: str, namespaces: Sequence[str]) -> dict[tuple[str, str], str]: ...
    def child_exists(self, kind: str, namespace: str, name: str) -> bool: ...
    def patch_service_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...
    def emit_event(self, regarding: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class _Write:
    """A child to apply: its manifest and digest, and what the read before the write found (None: absent)."""

    key: ChildKey
    child: Mapping[str, Any]
    digest: str
    read: Ownership | None


def _digest(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


class _NamespaceCache:
    """Namespace facts, read at most once per `ttl` seconds per namespace: Pod Security labels and termination
    change rarely, and reading them on every reconcile was one API call per reconcile. A namespace's facts are
    dropped when one of its services is deleted (as all are when it is): a namespace made again under its name
    is read anew, its UID (which keys the node cache directories) with it."""

    def __init__(self, cluster: ClusterFacts, ttl: float, monotonic: Callable[[], float]) -> None:
        self.cluster, self.ttl, self.monotonic = cluster, ttl, monotonic
        self._facts: dict[str, tuple[float, NamespaceFacts]] = {}

    def read_namespace(self, namespace: str) -> NamespaceFacts:
        now = self.monotonic()
        cached = self._facts.get(namespace)
        if cached is not None and now < cached[0]:
            return cached[1]
        facts = self.cluster.read_namespace(namespace)
        self._facts[namespace] = (now + self.ttl, facts)
        return facts

    def drop(self, namespace: str) -> None:
        self._facts.pop(namespace, None)

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        return self.cluster.read_secret_key(namespace, name, key)


class Reconciler:
    """Reconciles one service at a time per service (a lock each), on worker threads. It reads and writes the
    operator's memory and the rollout pacer, which the controller's state owns beside it (controller/state.py):
    dispatch asks them, not the reconciler, what an event means."""

    def __init__(
        self,
        kube: KubeGateway,
        hub: ModelConfigSource,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        namespace_cache_seconds: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
        policy: OperatorPolicy = DEFAULT_POLICY,
        memory: OperatorMemory | None = None,
        pacer: RolloutPacer | None = None,
        adapters: AdapterConfigSource | None = None,
    ) -> None:
        self.kube = kube
        self.hub = hub
        self.adapters = adapters
        self.policy = policy
        self.clock = clock
        self.pacer = pacer if pacer is not None else RolloutPacer(policy.max_concurrent_rollouts)
        self.memory = memory if memory is not None else OperatorMemory()
        self._cluster = _NamespaceCache(kube, namespace_cache_seconds, monotonic)
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock(self, key: tuple[str, str]) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """Drop the reconciler's own keeping for a deleted service: its lock and its namespace's facts."""
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
        self._cluster.drop(namespace)

    def _writes(
        self, children: Sequence[Mapping[str, Any]], owner_uid: str, watched: Sequence[ChildSeen], observed: Observed
    ) -> list[_Write]:
        """The children to write, each with what it is known to be: one whose manifest this process last applied for
        this very service (its uid) unchanged is not written again; one the watches show controlled by the service
        is written over as they show it, carrying their resourceVersion (if the object changed since, the API server
        refuses, and the retry reads the watches' newer view); one they show controlled by another object, or of a
        kind they do not watch that the status lists as written, is read now (a conflict before anything is written
        if it is not the service's); every other is written as a create, which an object of its name refuses
        (controller/owned.py). An object someone else made, or that another service owns, is never adopted or
        overwritten."""
        seen = {(c.kind, c.namespace, c.name): c.ownership for c in watched}
        listed = set(observed.status.get(OPTIONAL_CHILDREN) or ())
        writes = []
        for child in children:
            meta = child["metadata"]
            key = (child["kind"], meta["namespace"], meta["name"])
            digest = _digest(child)
            if self.memory.unchanged(key, digest, owner_uid):
                continue
            known = seen.get(key)
            anothers = known is not None and known.controller_uid != owner_uid
            likely_there = known is None and child_ref(child, observed.owner) in listed  # a create would be refused
            if anothers or likely_there:
                known = read_owned(self.kube, child, owner_uid, KIND)
            writes.append(_Write(key, child, digest, known))
        return writes

    def _apply(self, write: _Write, owner_uid: str) -> Mapping[str, Any]:
        self.memory.applying(write.key)
        stored = write_owned(self.kube, write.child, owner_uid, write.read, KIND)
        assert stored is not None  # written over, or made
        owner = write.child["metadata"]["labels"][SERVICE_LABEL]
        self.memory.applied(write.key, write.digest, stored, owner, owner_uid)
        return stored

    def _create_sizing_job(self, job: Mapping[str, Any], owner_uid: str) -> None:
        """The Job gather found absent, made; a same-name Job someone else made is a conflict, never taken over, and
        the service's own is left as it is. Not remembered as applied: it ends and Kubernetes removes it."""
        write_owned(self.kube, job, owner_uid, None, KIND, keep_existing=True)

    def _delete(self, children: Sequence[Mapping[str, str]], owner_uid: str) -> None:
        for gone in children:
            self.kube.delete(gone["apiVersion"], gone["kind"], gone["namespace"], gone["name"], owner_uid)

    def _admitted(self, decision: Decision, observed: Observed, key: ServiceKey) -> Decision:
        """The decision to carry out: as decided, unless it rolls the servers out for a change their user did not
        ask for and no rollout slot is free; then the one that leaves their Deployment as it is."""
        if not decision.paced_rollout:
            self.pacer.settled(key)
            return decision
        if self.pacer.admit(key):
            return decision
        return decide(replace(observed, rollout_held=True), self.clock())

    def reconcile(
        self, service: Mapping[str, Any], view: ClusterView = EMPTY_VIEW, ticket: int | None = None
    ) -> Plan | CpuLLMError | None:
        """Bring children and status in line with the spec, in the cluster as `view` shows it (Kopf's indexes,
        read at the entrance: controller/dispatch.py); returns the plan or the error reported, or None when the
        namespace is being deleted (nothing may be created there; everything goes with it) or the reconcile was
        superseded. `ticket` is what `begin` gave when the view was read (None: not ordered, as in the tests)."""
        meta = service["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._lock(key):
            if self.memory.superseded(key, ticket):
                RECONCILES.labels(outcome="superseded").inc()
                return None  # a reconcile that read newer facts (or the service's deletion) came after
            started = time.monotonic()
            outcome = self._reconcile(service, view)
        label = _outcome_label(outcome)
        RECONCILES.labels(outcome=label).inc()
        RECONCILE_SECONDS.labels(outcome=label).observe(time.monotonic() - started)
        if isinstance(outcome, PlanRefusal | InvalidSpec):
            PLAN_REFUSALS.labels(reason=outcome.reason).inc()
        log.debug("%s/%s reconciled: %s", meta["namespace"], meta["name"], label)
        return outcome

    def _reconcile(self, service: Mapping[str, Any], view: ClusterView) -> Plan | CpuLLMError | None:
        meta = service["metadata"]
        uid, key = str(meta.get("uid")), (meta["namespace"], meta["name"])
        try:
            observed = gather(
                service,
                view,
                last_status=self.memory.written(uid),
                cluster=self._cluster,
                models=as_namespace(self.hub, key[0]),
                adapters=as_namespace(self.adapters, key[0]),
                policy=self.policy,
                sizing_jobs=self.kube,
                read_spec=parse_stored_spec,
            )
            decision = self._admitted(decide(observed, self.clock()), observed, key)
            try:
                writes = self._writes(decision.children, uid, view.children, observed)
                self._delete(decision.obsolete_deleted(before_writes=True), uid)
                for write in writes:
                    stored = self._apply(write, uid)
                    if decision.paced_rollout and is_servers_deployment(write.child):
                        self.pacer.started(key, int(stored.get("metadata", {}).get("generation") or 0))
                self._delete(decision.obsolete_deleted(before_writes=False), uid)
                if decision.sizing_job is not None:
                    self._create_sizing_job(decision.sizing_job, uid)
            except (ChildRejected, ChildConflict, PermissionDenied) as err:
                self.pacer.settled(key)  # a slot taken for a rollout that was not written is free again
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
            self.memory.wrote(uid, decision.status)
        for event in decision.events:
            log.info("%s/%s %s %s: %s", owner.namespace, owner.name, event.type, event.reason, event.message)
            self.kube.emit_event(regarding(owner), event.type, event.reason, event.message)


def _outcome_label(outcome: Plan | CpuLLMError | None) -> str:
    if outcome is None:
        return "skipped"
    if isinstance(outcome, Plan):
        return "planned"
    return "refused" if isinstance(outcome, PlanRefusal | InvalidSpec) else "retried"
