"""A server pod's /metrics, read for the PerformanceAsPredicted check (core/performance_check.py): one GET to the pod's
address, parsed with prometheus_client's own text parser.

The image is the spec's, so the answer is a tenant's: it is read within a deadline and a byte bound, and only the
series the check reads are kept (summed over their labels)."""

from __future__ import annotations

import http.client
import math
import time
import urllib.request
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from cpullm.core.performance_check import FIRST_TOKEN, INTER_TOKEN, RUNNING
from cpullm.vllm_support import CONTAINER_CPUS, CPU_PERIODS, CPU_THROTTLED_PERIODS

MAX_BYTES = 4 << 20  # vLLM's own /metrics is ~100 KiB
CHUNK = 64 << 10
WANTED = frozenset(
    {f"{name}_{part}" for name in (*INTER_TOKEN, FIRST_TOKEN) for part in ("sum", "count")}
    | {RUNNING, CONTAINER_CPUS, CPU_PERIODS, CPU_THROTTLED_PERIODS}
)


class MetricsUnreadable(Exception):
    """The pod's /metrics could not be read or parsed; the message says why, in words."""


def read_metrics(address: str, port: int, timeout: float = 5.0) -> dict[str, float]:
    """The wanted series of http://address:port/metrics, each summed over its label sets."""
    url = f"http://{address}:{port}/metrics"
    deadline = time.monotonic() + timeout
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = bytearray()
            while chunk := response.read(CHUNK):
                body += chunk
                if len(body) > MAX_BYTES:
                    raise MetricsUnreadable(f"{url} answered more than {MAX_BYTES >> 20} MiB")
                if time.monotonic() > deadline:
                    raise MetricsUnreadable(f"{url} took more than {timeout:.0f} s to answer")
    except (OSError, ValueError, http.client.HTTPException) as error:  # URLError is an OSError; a bad status line not
        raise MetricsUnreadable(f"{url}: {getattr(error, 'reason', error)}") from None
    return wanted_series(body.decode("utf-8", errors="replace"))


def wanted_series(text: str) -> dict[str, float]:
    """The WANTED samples of a Prometheus text exposition, summed over their labels (finite values only)."""
    try:
        return _summed(
            (sample.name, sample.value) for family in text_string_to_metric_families(text) for sample in family.samples
        )
    except (ValueError, TypeError, IndexError) as error:
        raise MetricsUnreadable(f"not Prometheus' text format: {error}") from None


def _summed(samples: Iterable[tuple[str, float]]) -> dict[str, float]:
    found: dict[str, float] = {}
    for name, value in samples:
        if name in WANTED and math.isfinite(value):
            found[name] = found.get(name, 0.0) + value
    return found
