"""What the operator remembers between events, apart from any one reconcile (controller/reconcile.py uses it): what
it last applied to each child, which reconcile of each service read the newest facts, and the status it last wrote.
It decides which watch events need a reconcile (the operator's own writes come back as events: most need none) and
which children a listing shows changed by someone else. Lost on a restart: then every service is reconciled on its
first listing and compared with its own status."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cpullm.core.children import marker
from cpullm.core.status import READY, deployment_facts

ChildKey = tuple[str, str, str]  # kind, namespace, name
ServiceKey = tuple[str, str]  # namespace, name


@dataclass(frozen=True)
class Applied:
    """What the operator last applied to a child, and how to tell a later change by someone else from noise:
    a Deployment's generation (its status changes all the time, its generation only with its spec), the
    resourceVersion of the others (nothing but a change of them bumps it); and the service that owns it (its
    name, and its uid: a later service of the same name is another owner)."""

    digest: str
    marker: str
    owner: str
    owner_uid: str


@dataclass(frozen=True)
class Started:
    """The latest reconcile of a service to read its facts: its ticket, the service's uid and generation (the
    spec it read), and what it read of the owned Deployment's status that the service's status reports."""

    ticket: int
    uid: str
    generation: int
    deployment: tuple[int, int, str | None]


class OperatorMemory:
    def __init__(self) -> None:
        # What was last applied to each child: a child whose desired manifest did not change and that nobody
        # changed since (child_event) is not applied again; a no-op server-side apply is still an API write.
        self._applied: dict[ChildKey, Applied] = {}
        # Per service, the latest reconcile to read its facts (`begin`, on the event loop, so in order). An older
        # one still waiting for the service's lock is superseded: run after the newer, it would report older
        # facts. And a child event that brings nothing newer than what that reconcile read needs none.
        self._latest: dict[ServiceKey, Started] = {}
        self._tickets = itertools.count(1)
        # The operator is the only writer of status; what it last wrote (per object uid) is newer than a
        # watch snapshot that may not have caught up yet, and comparing against it avoids repeated patches
        # and events. Empty after a restart: the object's own status is used then.
        self._written: dict[str, Mapping[str, Any]] = {}

    def begin(self, service: Mapping[str, Any], deployment: Mapping[str, Any] | None) -> int:
        """Where a reconcile reads its facts (the service, its Deployment as last seen): its ticket. Called on the
        event loop, where Kopf updates what the facts are read from, so tickets follow the order of the facts."""
        meta = service["metadata"]
        ticket = next(self._tickets)
        facts = deployment_facts((deployment or {}).get("status"))
        generation = int(meta.get("generation") or 0)
        self._latest[meta["namespace"], meta["name"]] = Started(ticket, str(meta.get("uid")), generation, facts)
        return ticket

    def superseded(self, key: ServiceKey, ticket: int | None) -> bool:
        """Whether a reconcile that read newer facts (or the service's deletion) came after this ticket's."""
        latest = self._latest.get(key)
        return ticket is not None and (latest is None or latest.ticket != ticket)

    def service_event(self, service: Mapping[str, Any]) -> bool:
        """A watch event of a CpuLLMService (in Kopf's listings too): whether it needs a reconcile. Yes when no
        reconcile read this spec yet: the service is new, its spec changed (its generation), or this process has
        not reconciled it (its first listing, as after a restart). No for the operator's own status
        patches and metadata edits, which change nothing it reads."""
        meta = service["metadata"]
        latest = self._latest.get((meta["namespace"], meta["name"]))
        spec_read = (str(meta.get("uid")), int(meta.get("generation") or 0))
        return latest is None or (latest.uid, latest.generation) != spec_read

    def child_event(
        self, kind: str, namespace: str, name: str, event: str | None, body: Mapping[str, Any], owner: str
    ) -> bool:
        """A watch event of an owned child (event None: in Kopf's re-listing after a watch failed, e.g. an API
        server restart): whether its owner needs a reconcile.

        Yes when someone else changed or deleted the child (it is then applied again: a Deployment's generation
        or another kind's resourceVersion differs from what the operator's apply returned); when the servers'
        Deployment's replica counts or pod-creation failure are not those the owner's latest reconcile read; and
        for any watch event of a child this process has not applied (yet). No for the operator's own writes and a
        Deployment's other status updates: those reconciles changed nothing (4 of the 6 per service at N=1,000).
        In a re-listing, a child known to nothing (the operator's first listing) needs none: every service is
        reconciled on its own listing."""
        key = (kind, namespace, name)
        applied = self._applied.get(key)
        if applied is not None and (event == "DELETED" or marker(body) != applied.marker):
            self._applied.pop(key, None)
            return True
        latest = self._latest.get((namespace, owner))
        if applied is None or latest is None:
            return event is not None
        return kind == "Deployment" and name == owner and deployment_facts(body.get("status")) != latest.deployment

    def unchanged(self, key: ChildKey, digest: str, owner_uid: str) -> bool:
        """Whether this very manifest was last applied for this very service, and nobody changed the child since."""
        applied = self._applied.get(key)
        return applied is not None and applied.digest == digest and applied.owner_uid == owner_uid

    def applying(self, key: ChildKey) -> None:
        """Until the server confirms an apply, the child is not known to match anything."""
        self._applied.pop(key, None)

    def applied(self, key: ChildKey, digest: str, stored: Mapping[str, Any], owner: str, owner_uid: str) -> None:
        self._applied[key] = Applied(digest, marker(stored), owner, owner_uid)

    def drifted(
        self,
        kind: str,
        listing: Callable[[], Mapping[tuple[str, str], str]],
        exists: Callable[[ChildKey], bool],
    ) -> tuple[list[ServiceKey], list[ChildKey]]:
        """From a listing of `kind` (each child's marker, listed after what was applied is noted: an apply while it
        runs is newer than it), the owners of the children the operator applied that no longer exist or another
        writer changed, forgotten so their owner's next reconcile applies them again; and the children the listing
        misses that `exists` says are there (left as they are). Each one the listing misses is read (`exists`)
        before it counts as gone: taking a live child for deleted would report it as not ready, and re-applying it
        unchanged brings no event to correct that."""
        before = {key: applied for key, applied in list(self._applied.items()) if key[0] == kind}
        present = listing()
        owners: set[ServiceKey] = set()
        missed: list[ChildKey] = []
        for key, applied in before.items():
            # Still the same entry: not re-applied while the listing ran (then it may be newer than the listing).
            if present.get((key[1], key[2])) == applied.marker or self._applied.get(key) is not applied:
                continue
            if (key[1], key[2]) not in present and exists(key):
                missed.append(key)
            elif self._applied.get(key) is applied:
                self._applied.pop(key, None)
                owners.add((key[1], applied.owner))
        return sorted(owners), missed

    def written(self, uid: str) -> Mapping[str, Any] | None:
        """The status last written for the object of this uid (None: none since this process started)."""
        return self._written.get(uid)

    def wrote(self, uid: str, status: Mapping[str, Any]) -> None:
        self._written[uid] = status

    def readiness(self) -> dict[str, int]:
        """How many services the operator last reported Ready=True and Ready=False."""
        counts = {"True": 0, "False": 0}
        for status in list(self._written.values()):
            ready = next((c for c in status.get("conditions") or [] if c.get("type") == READY), None)
            if ready is not None:
                counts[ready["status"]] = counts.get(ready["status"], 0) + 1
        return counts

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """Drop what is remembered of a deleted service (its children go by garbage collection)."""
        self._latest.pop((namespace, name), None)
        self._written.pop(uid, None)
        for key in [k for k, applied in self._applied.items() if k[1] == namespace and applied.owner == name]:
            self._applied.pop(key, None)
