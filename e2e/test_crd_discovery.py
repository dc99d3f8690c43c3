"""A CRD installed after the operator started is watched, install after install. Kopf reads the API server's
discovery at the CRD's events, and the last of them (Established) can come before discovery lists the new kind; the
operator's wait (controller/discovery_wait.py) holds Kopf's read back until it does. Here a Kopf operator with that
wait runs in this process against the real API server, indexing a kind of the test's own (the NodeResourceTopology
CRD's versions and schemas under another group) whose CRD is installed and removed again and again. Whether Kopf
without the wait misses an install depends on timing: bench/crd_discovery_bench.py measures how often
(docs/testing.md).
"""

from __future__ import annotations

from testbed.kopf_probe import installed_and_indexed, kopf_probe, probe_crd
from testbed.tools import Kubectl

from cpullm.controller import discovery_wait

INSTALLS = 5


def test_a_crd_installed_after_the_operator_is_watched_every_time(kubectl: Kubectl, crd_files: dict[str, str]):
    crd = probe_crd(crd_files["NODERESOURCETOPOLOGY_CRD"])
    with kopf_probe(kubectl, on_startup=discovery_wait.install) as indexed:
        watched = [installed_and_indexed(kubectl, crd, indexed, f"probe-{i}", timeout=20) for i in range(INSTALLS)]
    assert watched == [True] * INSTALLS
