"""A Kopf operator in a thread of this process that indexes a kind of the suite's own, started before that kind's
CRD exists: how Kopf follows a CRD installed after it started (e2e/test_crd_discovery.py,
bench/crd_discovery_bench.py)."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kopf
import yaml
from kopf._core.reactor import observation  # Kopf's handler of CRD events, put back as it was after the probe

from cpullm.core import node_topology
from testbed.objects import topology_object
from testbed.tools import Kubectl, eventually

GROUP, PLURAL, KIND = "discovery.e2e.cpullm.io", "probes", "Probe"
CRD_NAME = f"{PLURAL}.{GROUP}"


def probe_crd(path: str) -> dict[str, Any]:
    """The NodeResourceTopology CRD at `path` (scripts/fetch-crds.sh) under the probe's own group and names: the
    same versions and schemas, so the API server takes as long to serve it, and no test's NodeResourceTopology
    CRD is touched."""
    crd: dict[str, Any] = yaml.safe_load(Path(path).read_text())
    crd["metadata"] = {"name": CRD_NAME}
    crd["spec"]["group"] = GROUP
    crd["spec"]["names"] = {"plural": PLURAL, "singular": KIND.lower(), "kind": KIND, "listKind": f"{KIND}List"}
    crd.pop("status", None)
    return crd


def probe_object(name: str) -> dict[str, Any]:
    """An object of the probe's kind, valid under the NodeResourceTopology schema of node_topology.VERSION."""
    return {**topology_object(name), "apiVersion": f"{GROUP}/{node_topology.VERSION}", "kind": KIND}


class Indexed:
    """The names Kopf's index of the probe kind has seen (Kopf's thread adds, the caller reads)."""

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def add(self, name: str) -> None:
        with self._lock:
            self._names.add(name)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._names


@contextmanager
def kopf_probe(kubectl: Kubectl, on_startup: Callable[[], Any] = lambda: None) -> Iterator[Indexed]:
    """Kopf running until the block ends; `on_startup` runs in its startup handler (where the operator installs
    its changes to Kopf). Kopf's module and KUBECONFIG are as they were afterwards, and the probe's CRD is gone."""
    kept_handler, kept_kubeconfig = observation.process_discovered_resource_event, os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = kubectl.kubeconfig  # where Kopf's kubeconfig login reads it
    registry, indexed, stop, ready = kopf.OperatorRegistry(), Indexed(), threading.Event(), threading.Event()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def start(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False
        on_startup()

    @kopf.index(GROUP, node_topology.VERSION, PLURAL, registry=registry)
    def probes(name: str, **_: Any) -> dict[str, bool]:
        indexed.add(name)
        return {name: True}

    def run() -> None:
        asyncio.run(
            kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop, ready_flag=ready)
        )

    thread = threading.Thread(target=run, name="kopf-probe", daemon=True)
    thread.start()
    try:
        if not ready.wait(timeout=60):
            raise AssertionError("the Kopf probe did not start within 60 s")
        yield indexed
    finally:
        stop.set()
        thread.join(timeout=60)
        collect_what_kopf_left()
        observation.process_discovered_resource_event = kept_handler
        if kept_kubeconfig is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = kept_kubeconfig
        kubectl.run("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait", check=False)


def collect_what_kopf_left() -> None:
    """Kopf stopped in a thread leaves its tasks, coroutines and connections in reference cycles (~1,350 objects a
    run here), which Python's cyclic collector finalizes at some later moment, inside whichever test is running then.
    One CI run on kind failed the next file's first test with two unraisable warnings (2026-11-26); these cycles are
    the only asyncio objects the suite's process makes before it. They are finalized here instead, and a connection
    Kopf still had open when it stopped is shown as a ResourceWarning in pytest's summary, not raised in another
    test."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()


def installed_and_indexed(kubectl: Kubectl, crd: dict[str, Any], indexed: Indexed, name: str, timeout: float) -> bool:
    """Install the probe's `crd` (Kopf running), create an object `name` of its kind as soon as kubectl finds the
    kind, and say whether Kopf indexed it within `timeout`; the CRD is removed, and gone from discovery, after."""
    kubectl.apply(crd)
    kubectl.wait_established(CRD_NAME)
    eventually(lambda: kubectl.apply(probe_object(name)), timeout=30, what=f"kubectl to create a {KIND}")
    try:
        eventually(lambda: name in indexed, timeout=timeout, what=f"Kopf to index {name}")
        seen = True
    except AssertionError:
        seen = False
    kubectl.run("delete", "crd", CRD_NAME, "--wait")
    eventually(lambda: GROUP not in kubectl.run("api-versions").stdout, timeout=30, what=f"{GROUP} gone")
    return seen
