"""Kopf finds the kinds a cluster serves by reading the API server's discovery, and re-reads a CRD's group at each
event of that CRD, never later. A new CRD's last event (Established) can reach the operator before discovery lists
its group: on our control plane the group was listed from 92 ms before to 27 ms after that event (docs/testing.md).
When Kopf reads too early it does not watch the new kind until the operator restarts, which is how a
NodeResourceTopology CRD installed after the operator went unseen in one CI run.

`install` wraps Kopf's handler of CRD events (kopf 1.45, pinned): for an Established CRD whose kind discovery does
not list yet, it reads discovery again, backing off, until it does, and only then lets Kopf scan. Kopf handles each
CRD's events in a task of its own, so the wait holds back no other object."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

# Waits between reads of discovery for a CRD that is Established but not yet listed: ~40 s in all, far longer than
# the lag measured (tens of milliseconds), short enough that a CRD the API server never serves is reported.
DISCOVERY_WAITS_SECONDS = (0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 12.0)
WRAPPED_MARK = "_cpullm_waits_for_discovery"  # marks Kopf's handler once wrapped, so installing twice wraps once


class DiscoveredResource(Protocol):
    """What the wait reads of one resource Kopf's scan found (its `references.Resource`)."""

    @property
    def group(self) -> str: ...

    @property
    def plural(self) -> str: ...

    @property
    def version(self) -> str: ...


Scan = Callable[..., Awaitable[Collection[DiscoveredResource]]]
Process = Callable[..., Awaitable[Any]]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class CustomKind:
    """A kind a CRD defines, as discovery lists it: in each version the CRD serves."""

    group: str
    plural: str
    versions: frozenset[str]

    def listed_in(self, found: Collection[DiscoveredResource]) -> bool:
        """Whether discovery lists this kind in every version its CRD serves (each version is read on its own)."""
        return self.versions <= {r.version for r in found if (r.group, r.plural) == (self.group, self.plural)}

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}"


def established_kind(raw_event: Mapping[str, Any]) -> CustomKind | None:
    """The kind of the CRD in a watch event and the versions it serves, where the API server says it is Established
    (so discovery should list it); None for the initial listing (Kopf already scanned), a deletion, and a CRD not
    Established yet (a later event will say when it is)."""
    crd = raw_event.get("object") or {}
    if raw_event.get("type") not in ("ADDED", "MODIFIED") or (crd.get("metadata") or {}).get("deletionTimestamp"):
        return None
    conditions = (crd.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
        return None
    spec = crd.get("spec") or {}
    group, plural = spec.get("group"), (spec.get("names") or {}).get("plural")
    versions = frozenset(v.get("name") for v in spec.get("versions") or [] if v.get("served") and v.get("name"))
    return CustomKind(group, plural, versions) if group and plural and versions else None


async def waits_until_served(served: Callable[[], Awaitable[bool]], sleep: Sleep = asyncio.sleep) -> int | None:
    """How many of DISCOVERY_WAITS_SECONDS passed before `served()` was true (asked before each wait and once after
    the last); None if it never was."""
    for waited, wait in enumerate(DISCOVERY_WAITS_SECONDS):
        if await served():
            return waited
        await sleep(wait)
    return len(DISCOVERY_WAITS_SECONDS) if await served() else None


def waiting_for_discovery(process: Process, scan: Scan, sleep: Sleep = asyncio.sleep) -> Process:
    """Kopf's handler of CRD events `process`, run once `scan` (Kopf's discovery read) lists the kind of an
    Established CRD, or once the waits ran out (then a warning says the kind goes unwatched)."""

    async def process_once_listed(*, raw_event: Mapping[str, Any], settings: Any, **kwargs: Any) -> Any:
        kind = established_kind(raw_event)
        if kind is not None:
            await _until_listed(kind, scan, settings, sleep)
        return await process(raw_event=raw_event, settings=settings, **kwargs)

    setattr(process_once_listed, WRAPPED_MARK, True)
    return process_once_listed


async def _until_listed(kind: CustomKind, scan: Scan, settings: Any, sleep: Sleep) -> None:
    async def listed() -> bool:
        return kind.listed_in(await scan(groups={kind.group}, settings=settings, logger=log))

    started = time.monotonic()
    waits = await waits_until_served(listed, sleep)
    if waits:
        log.info(
            "%s: the API server's discovery listed it %.1f s after its CRD was Established; Kopf scans its group now",
            kind,
            time.monotonic() - started,
        )
    elif waits is None:
        log.warning(
            "%s: its CRD is Established but the API server's discovery has not listed it for %.0f s; it is not "
            "watched until its CRD changes again or the operator restarts",
            kind,
            time.monotonic() - started,
        )


def install() -> bool:
    """Wrap Kopf's handler of CRD events with the wait (once); False, with a warning, for a Kopf that has not the
    internals it wraps (then Kopf scans as it always did)."""
    try:
        from kopf._cogs.clients import scanning
        from kopf._core.reactor import observation

        process, scan = observation.process_discovered_resource_event, scanning.scan_resources
    except (ImportError, AttributeError):
        log.warning(
            "this Kopf has no resource scanning to wrap: a CRD installed after the operator may go unwatched until "
            "the operator restarts"
        )
        return False
    if not getattr(process, WRAPPED_MARK, False):
        # setattr: the wrapper takes Kopf's keywords loosely, so it is not typed as Kopf's own function
        setattr(observation, "process_discovered_resource_event", waiting_for_discovery(process, scan))  # noqa: B010
    return True
