"""Benchmark, not a test: how often Kopf misses a CRD installed after it started, without and with the operator's
wait for discovery (operator/cpullm/controller/discovery_wait.py), side by side in one run. On a local control
plane of its own, a Kopf operator in this process indexes a kind whose CRD (the NodeResourceTopology CRD's
versions and schemas under a group of the bench's own) is installed, given an object, and removed, `--installs`
times for each row; an install is missed when Kopf has not indexed the object within `--timeout` seconds (it then
never will: Kopf does not read discovery again until the CRD changes).

    .venv/bin/python bench/crd_discovery_bench.py [--installs 30] [--timeout 15]

Needs the tools of scripts/build-tools.sh. Results: docs/testing.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from testbed.cluster import LocalCluster
from testbed.kopf_probe import installed_and_indexed, kopf_probe, probe_crd
from testbed.tools import Kubectl, published_crds

from cpullm.controller import discovery_wait

ROWS = (("Kopf as it is", lambda: None), ("with the operator's wait", discovery_wait.install))


class HeldBack(logging.Handler):
    """Counts the installs whose scan the wait held back (its INFO line)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.levelno == logging.INFO


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--installs", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=15.0)
    args = parser.parse_args()
    held_back = HeldBack()
    wait_log = logging.getLogger(discovery_wait.__name__)
    wait_log.setLevel(logging.INFO)
    wait_log.addHandler(held_back)
    crd = probe_crd(published_crds()["NODERESOURCETOPOLOGY_CRD"])
    with tempfile.TemporaryDirectory(prefix="cpullm-crd-bench-") as workdir:
        cluster = LocalCluster.start(Path(workdir), name="cpullm-crd-bench")
        try:
            kubectl = Kubectl(str(cluster.kubectl), str(cluster.kubeconfig))
            results = []
            for row, on_startup in ROWS:  # Kopf as it is first: the wait, once installed, stays for the process
                started, held_back.count = time.monotonic(), 0
                with kopf_probe(kubectl, on_startup=on_startup) as indexed:
                    seen = [
                        installed_and_indexed(kubectl, crd, indexed, f"probe-{i}", args.timeout)
                        for i in range(args.installs)
                    ]
                results.append((row, seen.count(False), held_back.count, time.monotonic() - started))
        finally:
            cluster.delete()
    print(f"\n| Kopf {version('kopf')} | installs | missed | scans held back | time |\n| --- | --- | --- | --- | --- |")
    for row, missed, held, seconds in results:
        print(f"| {row} | {args.installs} | {missed} | {held} | {seconds:.0f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
