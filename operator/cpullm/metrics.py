"""The operator's own Prometheus metrics (prometheus_client), served by `cpullm run --metrics-port PORT`.

Every metric is listed in the chart's README with what it is for. The controller records reconciles and the
services' readiness; io/kube.py records the API errors it maps; the node index records the node profiles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

RECONCILES = Counter(
    "cpullm_reconciles_total",
    "Reconciles of CpuLLMServices, by outcome: planned, refused (a condition says why), retried (the API "
    "server or the Hub could not be reached, or permission was denied), skipped (namespace being deleted) or "
    "superseded (a reconcile of the same service that read newer facts came after it and reports instead).",
    ["outcome"],
)
# Every outcome's series from the start, at 0: a rate of retries, or an alert on it, then has series to read before
# the first retry (https://prometheus.io/docs/practices/instrumentation/#avoid-missing-metrics).
for _outcome in ("planned", "refused", "retried", "skipped", "superseded"):
    RECONCILES.labels(outcome=_outcome)
RECONCILE_SECONDS = Histogram(
    "cpullm_reconcile_duration_seconds",
    "Wall time of one reconcile (gather, decide, apply), by outcome.",
    ["outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
PLAN_REFUSALS = Counter(
    "cpullm_plan_refusals_total",
    "Reconciles that ended without a plan, by the Planned condition's reason (NoEligibleNode, ModelTooLarge, ...).",
    ["reason"],
)
API_ERRORS = Counter(
    "cpullm_api_errors_total",
    "Kubernetes API calls that failed, by the typed error they became (PermissionDenied, ChildRejected, "
    "ApiUnavailable) or by HTTP status when left unmapped.",
    ["error"],
)
POD_TROUBLES = Counter(
    "cpullm_pod_troubles_total",
    "Service pods seen to start failing to start or to keep running, by the Ready reason it gave (ImagePullFailed, "
    "ContainerConfigError, OOMKilled, WrongArchitecture, StartupTooSlow, CrashLoopBackOff, Unschedulable).",
    ["reason"],
)
SPEED_SHARE = Gauge(
    "cpullm_server_speed_share",
    "Each service's servers' decode speed over the plan's prediction at the same sequences at once, as the last "
    "performance check read it (1: as predicted; PerformanceAsPredicted is False below 0.5).",
    ["namespace", "service"],
)
NODE_PROFILES = Gauge("cpullm_node_profiles", "Nodes the planner can use (their labels parse into a node profile).")


class _ServicesByReadiness(Collector):
    """cpullm_services{ready}: counted at scrape time from the statuses the operator last wrote."""

    def __init__(self, count: Callable[[], Mapping[str, int]]) -> None:
        self.count = count

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "cpullm_services", "CpuLLMServices by their Ready condition (True, False).", labels=["ready"]
        )
        for ready, number in sorted(self.count().items()):
            family.add_metric([ready], number)
        yield family


def track_services(count: Callable[[], Mapping[str, int]]) -> None:
    REGISTRY.register(_ServicesByReadiness(count))


class Prediction(NamedTuple):
    """A plan's predicted speed per server (status.plan.predicted), as the metrics below give it."""

    decode: float
    throughput: float
    streams: int
    first_token: float
    prompt_tokens: int


class _PredictedSpeeds(Collector):
    """cpullm_predicted_*{namespace, service}: the plan's predicted speed of each service whose servers the
    performance check reads, read at scrape time, so each stands beside the vLLM series it is compared with (the
    chart's dashboard and alert rules)."""

    def __init__(self, predictions: Callable[[], Mapping[tuple[str, str], Prediction]]) -> None:
        self.predictions = predictions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        service = ["namespace", "service"]
        decode = GaugeMetricFamily(
            "cpullm_predicted_decode_tokens_per_second",
            "One sequence's generated tokens per second a server of the service is predicted to decode.",
            labels=service,
        )
        throughput = GaugeMetricFamily(
            "cpullm_predicted_throughput_tokens_per_second",
            "Generated tokens per second a server is predicted to reach with `streams` sequences at once (maxNumSeqs).",
            labels=[*service, "streams"],
        )
        first_token = GaugeMetricFamily(
            "cpullm_predicted_time_to_first_token_seconds",
            "An idle server's predicted time to the first token of a prompt of `prompt_tokens` tokens.",
            labels=[*service, "prompt_tokens"],
        )
        for (namespace, name), p in sorted(self.predictions().items()):
            decode.add_metric([namespace, name], p.decode)
            throughput.add_metric([namespace, name, str(p.streams)], p.throughput)
            first_token.add_metric([namespace, name, str(p.prompt_tokens)], p.first_token)
        yield from (decode, throughput, first_token)


def track_predictions(predictions: Callable[[], Mapping[tuple[str, str], Prediction]]) -> None:
    REGISTRY.register(_PredictedSpeeds(predictions))


def serve(port: int) -> None:
    """Serve /metrics on all addresses (a background thread)."""
    start_http_server(port)
