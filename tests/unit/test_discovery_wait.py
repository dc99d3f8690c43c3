"""The wait for discovery before Kopf scans a new CRD's group: which events wait, how long, and the wrap of the
pinned Kopf's own handler."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import pytest
from kopf._core.reactor import observation

from cpullm.controller import discovery_wait
from cpullm.controller.discovery_wait import DISCOVERY_WAITS_SECONDS, CustomKind, established_kind

NRT = CustomKind("topology.node.k8s.io", "noderesourcetopologies", frozenset({"v1alpha1", "v1alpha2"}))


def crd_event(type_: str | None, *, established: str | None = "True", deleting: bool = False) -> dict[str, Any]:
    conditions = [{"type": "NamesAccepted", "status": "True"}]
    if established is not None:
        conditions.append({"type": "Established", "status": established})
    metadata: dict[str, Any] = {"name": str(NRT)}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-26T10:00:00Z"
    return {
        "type": type_,
        "object": {
            "metadata": metadata,
            "spec": {
                "group": NRT.group,
                "names": {"plural": NRT.plural, "kind": "NodeResourceTopology"},
                "versions": [
                    {"name": "v1alpha1", "served": True},
                    {"name": "v1alpha2", "served": True},
                    {"name": "v1alpha0", "served": False},  # not served: discovery never lists it
                ],
            },
            "status": {"conditions": conditions},
        },
    }


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        pytest.param(crd_event("ADDED"), NRT, id="added-established"),
        pytest.param(crd_event("MODIFIED"), NRT, id="modified-established"),
        pytest.param(crd_event("MODIFIED", established="False"), None, id="not-established-yet"),
        pytest.param(crd_event("ADDED", established=None), None, id="just-created"),
        pytest.param(crd_event(None), None, id="initial-listing"),
        pytest.param(crd_event("DELETED"), None, id="deleted"),
        pytest.param(crd_event("MODIFIED", deleting=True), None, id="being-deleted"),
        pytest.param({"type": "MODIFIED", "object": {}}, None, id="no-body"),
        pytest.param(
            {**crd_event("MODIFIED"), "object": {**crd_event("MODIFIED")["object"], "spec": {"group": NRT.group}}},
            None,
            id="no-names-or-versions",
        ),
    ],
)
def test_only_an_established_crd_has_a_kind_to_wait_for(event: dict[str, Any], kind: CustomKind | None) -> None:
    assert established_kind(event) == kind


@dataclass(frozen=True)
class Resource:
    group: str
    plural: str
    version: str


class Discovery:
    """Kopf's discovery read, listing the kind in its first version from the `listed_at`-th read on and in both
    from the one after (never when None), and the sleeps."""

    def __init__(self, listed_at: int | None) -> None:
        self.listed_at, self.reads, self.slept = listed_at, 0, list[float]()
        self.processed: list[tuple[int, dict[str, Any]]] = []  # (reads done when Kopf's handler ran, its kwargs)

    async def scan(self, *, groups: set[str], settings: Any, logger: Any) -> set[Resource]:
        self.reads += 1
        listed = 0 if self.listed_at is None or NRT.group not in groups else max(0, self.reads - self.listed_at + 1)
        other = Resource(NRT.group, "othertopologies", "v1alpha2")  # same group, another kind: not the one waited for
        return {other, *(Resource(NRT.group, NRT.plural, v) for v in ("v1alpha1", "v1alpha2")[:listed])}

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    async def process(self, **kwargs: Any) -> str:
        self.processed.append((self.reads, kwargs))
        return "kopf's answer"


@pytest.mark.parametrize(
    ("event", "listed_at", "reads", "slept"),
    [
        pytest.param(crd_event("MODIFIED"), 0, 1, (), id="listed-at-once"),
        pytest.param(crd_event("MODIFIED"), 1, 2, DISCOVERY_WAITS_SECONDS[:1], id="one-version-listed-first"),
        pytest.param(crd_event("MODIFIED"), 3, 4, DISCOVERY_WAITS_SECONDS[:3], id="listed-after-three-waits"),
        pytest.param(
            crd_event("MODIFIED"), None, len(DISCOVERY_WAITS_SECONDS) + 1, DISCOVERY_WAITS_SECONDS, id="never-listed"
        ),
        pytest.param(crd_event("MODIFIED", established="False"), None, 0, (), id="not-established-no-wait"),
        pytest.param(crd_event("DELETED"), None, 0, (), id="deleted-no-wait"),
    ],
)
def test_kopf_scans_once_discovery_lists_the_kind_or_the_waits_run_out(
    event: dict[str, Any], listed_at: int | None, reads: int, slept: tuple[float, ...]
) -> None:
    discovery = Discovery(listed_at)
    process = discovery_wait.waiting_for_discovery(discovery.process, discovery.scan, discovery.sleep)

    answer = asyncio.run(process(raw_event=event, settings="kopf settings", registry="kopf registry"))

    assert answer == "kopf's answer"
    assert (discovery.reads, tuple(discovery.slept)) == (reads, slept)
    assert discovery.processed == [
        (reads, {"raw_event": event, "settings": "kopf settings", "registry": "kopf registry"})
    ]


def test_the_waits_span_tens_of_seconds() -> None:
    """Far beyond the lag measured (tens of milliseconds), short enough that a CRD never listed is reported."""
    assert 30 <= sum(DISCOVERY_WAITS_SECONDS) <= 60


@pytest.mark.parametrize(
    ("listed_at", "level", "says"),
    [
        pytest.param(2, logging.INFO, "Kopf scans its group now", id="late"),
        pytest.param(None, logging.WARNING, "not watched until its CRD changes again", id="never"),
    ],
)
def test_a_late_or_missing_kind_is_logged(
    caplog: pytest.LogCaptureFixture, listed_at: int, level: int, says: str
) -> None:
    discovery = Discovery(listed_at)
    process = discovery_wait.waiting_for_discovery(discovery.process, discovery.scan, discovery.sleep)
    with caplog.at_level(logging.INFO, logger=discovery_wait.__name__):
        asyncio.run(process(raw_event=crd_event("MODIFIED"), settings=None))
    [record] = caplog.records
    assert (record.levelno, str(NRT) in record.getMessage(), says in record.getMessage()) == (level, True, True)


def test_install_wraps_the_pinned_kopfs_handler_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf's resource observer looks its handler up when it starts watching CRDs, after the startup handlers:
    what install puts in Kopf's module is what runs."""
    original = observation.process_discovered_resource_event
    monkeypatch.setattr(observation, "process_discovered_resource_event", original)

    assert discovery_wait.install()
    wrapped = observation.process_discovered_resource_event
    assert wrapped is not original and getattr(wrapped, discovery_wait.WRAPPED_MARK)

    assert discovery_wait.install()
    assert observation.process_discovered_resource_event is wrapped


def test_a_kopf_without_the_handler_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(observation, "process_discovered_resource_event")
    with caplog.at_level(logging.WARNING, logger=discovery_wait.__name__):
        assert not discovery_wait.install()
    assert "may go unwatched until the operator restarts" in caplog.text
