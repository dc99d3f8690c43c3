"""How a server stops without cutting the requests it holds: the kubelet runs the preStop hook first, while the
pod already left the endpoints (kube-proxy and the router's DNS stop sending it new requests within
DRAIN_SETTLE_SECONDS); the hook waits that long, then until vLLM's metrics show nothing running or waiting, and
only then does vLLM get SIGTERM. The grace period bounds it all: the settle, the longest a request may run
(plan.drainSeconds), and vLLM's own exit. For rollouts, scale-down and node drains alike."""

from __future__ import annotations

from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core import constants as c

# Run by the image's python3 (stdlib only): `python3 -c DRAIN_SCRIPT <port> <settle seconds>`. A server that no
# longer answers holds nothing.
DRAIN_SCRIPT = """\
import sys, time, urllib.request
port, settle = int(sys.argv[1]), float(sys.argv[2])
time.sleep(settle)
gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
while True:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        break
    samples = (line.rpartition(" ") for line in text.splitlines() if not line.startswith("#"))
    held = sum(float(value) for name, _, value in samples if name.partition("{")[0] in gauges)
    if held == 0:
        break
    time.sleep(1)
"""


def drain_hook(spec: CpuLLMServiceSpec) -> dict[str, Any]:
    command = ["python3", "-c", DRAIN_SCRIPT, str(spec.service.port), str(c.DRAIN_SETTLE_SECONDS)]
    return {"preStop": {"exec": {"command": command}}}


def grace_seconds(plan: Plan) -> int:
    """The pod's terminationGracePeriodSeconds: what the drain may take, then vLLM's exit."""
    return c.DRAIN_SETTLE_SECONDS + plan.drain_seconds + c.SERVER_EXIT_SECONDS
