"""The PerformanceAsPredicted check: vLLM's /metrics read and parsed, windows between readings, the verdict against
the plan's prediction with the cause the figures show, and one round of the operator's check."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from cpullm.api.plan import Plan
from cpullm.api.spec import NetworkPolicyPeer
from cpullm.controller import performance
from cpullm.controller.indexes import KopfIndexes, seen_index
from cpullm.controller.memory import OperatorMemory
from cpullm.controller.pacing import RolloutPacer
from cpullm.controller.state import ControllerState
from cpullm.controller.workers import ReconcileWorkers
from cpullm.core.children import WATCHED_KINDS
from cpullm.core.children.common import Owner
from cpullm.core.children.network_policy import admit_operator, build_servers_network_policy
from cpullm.core.node_facts import NODE_FACT_SOURCES
from cpullm.core.observation import ClusterView
from cpullm.core.performance_check import (
    MIN_DECODE_TOKENS,
    ServerSample,
    Window,
    judge,
    predicted_step_seconds,
    ready_server_address,
    window,
)
from cpullm.core.planner import plan_service
from cpullm.io.server_metrics import MetricsUnreadable, wanted_series

from .builders import llama_8b, node, planned_service, spec

# What vLLM 0.32's /metrics holds of the series read (abridged; labels as vLLM writes them), with the pod's
# container_cpu_metrics.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{{engine="0",le="0.01",model_name="m"}} 0.0
vllm:inter_token_latency_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {tokens}
vllm:inter_token_latency_seconds_count{{engine="0",model_name="m"}} {tokens}
vllm:inter_token_latency_seconds_sum{{engine="0",model_name="m"}} {seconds}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {firsts}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {first_seconds}
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}
# TYPE cpullm_container_cpus gauge
cpullm_container_cpus {cpus}
# TYPE cpullm_container_cpu_periods_total counter
cpullm_container_cpu_periods_total {periods}
# TYPE cpullm_container_cpu_throttled_periods_total counter
cpullm_container_cpu_throttled_periods_total {throttled}
"""


def metrics_text(tokens=0, seconds=0.0, running=0, firsts=0, first_seconds=0.0, cpus=4, periods=0, throttled=0):
    return VLLM_METRICS.format(**locals())


def plan(**fields: Any) -> Plan:
    return Plan.model_validate(planned_service(**fields)["status"]["plan"])


def test_the_read_series_are_summed_over_labels_and_make_a_sample():
    series = wanted_series(metrics_text(tokens=100, seconds=5.0, running=2, firsts=3, first_seconds=1.5, cpus=2.5))
    sample = ServerSample.of(series, at=10.0)
    assert sample == ServerSample(10.0, 100, 5.0, 3, 1.5, 2, cpus=2.5, periods=0, throttled_periods=0)


@pytest.mark.parametrize(
    "text",
    ["not metrics {", '# TYPE x counter\nx{a="1"} NaNaN\n'],
    ids=["garbage", "bad value"],
)
def test_what_is_not_prometheus_text_is_unreadable(text):
    with pytest.raises(MetricsUnreadable, match="not Prometheus' text format"):
        wanted_series(text)


def test_metrics_without_vllms_histogram_make_no_sample():
    assert ServerSample.of(wanted_series("# TYPE up gauge\nup 1\n"), at=0.0) is None


def sample(at: float, tokens: float, seconds: float, **more: float) -> ServerSample:
    return ServerSample(
        at,
        tokens,
        seconds,
        more.get("firsts", 0),
        more.get("first_seconds", 0),
        more.get("running", 1),
        more.get("cpus"),
        more.get("periods"),
        more.get("throttled"),
    )


def test_a_restarted_server_or_no_time_makes_no_window():
    assert window(sample(0, 500, 10), sample(60, 100, 2)) is None  # its counters went back
    assert window(sample(60, 100, 2), sample(60, 200, 4)) is None
    w = window(sample(0, 100, 2, periods=10, throttled=1), sample(60, 700, 14, periods=610, throttled=301))
    assert (w.decode_tokens, w.decode_seconds, w.periods, w.throttled_periods) == (600, 12, 600, 300)


def test_the_predicted_step_runs_from_one_sequences_to_a_full_batchs():
    p = plan()
    assert p.predicted is not None
    streams = p.predicted.throughput_streams
    one, full = 1 / p.predicted.decode_tokens_per_second, streams / p.predicted.throughput_tokens_per_second
    assert predicted_step_seconds(p, 1) == pytest.approx(one)
    assert predicted_step_seconds(p, streams) == pytest.approx(full)
    assert predicted_step_seconds(p, 10 * streams) == pytest.approx(full)  # no more than maxNumSeqs at once
    middle = predicted_step_seconds(p, (1 + streams) / 2)
    assert middle == pytest.approx((one + full) / 2)


def decoding(p: Plan, share: float, seconds: float = 60, **more: Any) -> Window:
    """A window in which one sequence at a time decoded half the time at `share` of the predicted speed."""
    step = predicted_step_seconds(p, 1) / share
    tokens = seconds / 2 / step
    return Window(
        seconds, tokens, tokens * step, 0, 0, 1, more.get("cpus"), more.get("periods", 0), more.get("throttled", 0)
    )


@pytest.mark.parametrize(
    ("share", "more", "fields", "ok", "reason"),
    [
        pytest.param(1.0, {}, {}, True, "AsPredicted", id="as-predicted"),
        pytest.param(0.6, {}, {}, True, "AsPredicted", id="a-little-slower-is-no-alarm"),
        pytest.param(0.3, {"cpus": 1.0}, {}, False, "FewerCPUsThanPlanned", id="fewer-cpus"),
        pytest.param(0.3, {"periods": 600, "throttled": 300}, {}, False, "CPUThrottled", id="throttled"),
        pytest.param(0.3, {}, {"cpu": {"cpusPerRank": 48}}, False, "RanksAcrossNUMANodes", id="rank-over-numa-nodes"),
        pytest.param(0.3, {}, {}, False, "SlowerThanPredicted", id="no-cause-visible"),
    ],
)
def test_the_verdict_and_the_cause_it_names(share, more, fields, ok, reason):
    p = plan_service(spec(tensorParallelSize=1, **fields), llama_8b(), [node("n1", numa=2)])
    verdict = judge(p, [decoding(p, share, **more)])
    assert verdict is not None and (verdict.ok, verdict.reason) == (ok, reason)
    assert verdict.speed_share == pytest.approx(share)
    assert f"decode at {share:.2f} of the predicted speed" in verdict.message
    condition = verdict.condition()
    assert (condition.type, condition.ok) == ("PerformanceAsPredicted", ok)


def test_too_few_tokens_say_nothing():
    p = plan()
    few = decoding(p, 0.1)
    assert judge(p, [replace(few, decode_tokens=MIN_DECODE_TOKENS - 1)]) is None
    assert judge(p, []) is None


def test_more_sequences_at_once_are_held_to_the_slower_step_they_take():
    """A server decoding 8 sequences at once takes longer per token than one alone: judged against the prediction
    for 8, it is as predicted."""
    p = plan()
    step = predicted_step_seconds(p, 8)
    batch = Window(60, 800, 800 * step, 0, 0, 8, None, 0, 0)
    verdict = judge(p, [batch])
    assert verdict is not None and verdict.speed_share == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("labels", "status", "address"),
    [
        ({}, {"podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "True"}]}, "10.0.0.5"),
        ({}, {"podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "False"}]}, None),
        ({}, {"conditions": [{"type": "Ready", "status": "True"}]}, None),
        ({"cpullm.io/router": "svc"}, {"podIP": "10.0.0.6", "conditions": [{"type": "Ready", "status": "True"}]}, None),
    ],
    ids=["ready", "not-ready", "no-ip", "the-router"],
)
def test_only_ready_servers_are_read(labels, status, address):
    found = ready_server_address("p", labels, status)
    assert (found.ip if found else None) == address


def test_the_servers_network_policy_admits_the_operator_on_the_api_port():
    owner, parsed = Owner("svc", "ns"), spec()
    built = [build_servers_network_policy(owner, parsed, plan())]
    peer = NetworkPolicyPeer.model_validate(
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "op"}}}
    )
    admit_operator(built, owner, parsed.service.port, peer)
    rule = built[0]["spec"]["ingress"][-1]
    assert rule == {
        "from": [peer.model_dump(by_alias=True, exclude_defaults=True)],
        "ports": [{"protocol": "TCP", "port": parsed.service.port}],
    }
    untouched = [build_servers_network_policy(owner, parsed, plan())]
    admit_operator(untouched, owner, parsed.service.port, None)
    assert untouched == [build_servers_network_policy(owner, parsed, plan())]


class Reconciles:
    """The reconciler as check_round reaches it: it records the verdict each reconcile was handed."""

    def __init__(self) -> None:
        self.verdicts: list[Any] = []

    def reconcile(self, service: Any, view: ClusterView, ticket: int | None = None) -> None:
        self.verdicts.append(view.performance)


def state_around(reconciler: Reconciles) -> ControllerState:
    """The controller's state with the recording reconciler, a real memory and pacer, and no API client."""
    return ControllerState(reconciler, ReconcileWorkers(1), OperatorMemory(), RolloutPacer(None), None)  # type: ignore[arg-type]


def indexes(service: dict[str, Any], addresses: dict[Any, Any]) -> KopfIndexes:
    empty: dict[str, Any] = {
        name: {}
        for name in (
            "node_profiles",
            "daemonset_pods",
            "installed_crds",
            "gateways",
            "pod_troubles",
            "server_exits",
        )
    }
    return KopfIndexes.of(
        {
            **empty,
            **{s.index: {} for s in NODE_FACT_SOURCES},
            **{seen_index(kind.plural): {} for kind in WATCHED_KINDS},
            "services": {("ns", "svc"): [service]},
            # each address a pod of the service's Deployment's ReplicaSet (KopfIndexes.owned_pods)
            "server_addresses": {key: [("rs-svc", a) for a in store] for key, store in addresses.items()},
            "owned_deployments": {("ns", "svc"): [{"metadata": {"uid": "deploy-svc"}}]},
            "server_replicasets": {("ns", "rs-svc"): ["deploy-svc"]},
        }
    )


def test_a_round_reads_each_ready_server_and_reconciles_only_when_the_verdict_flips():
    service = planned_service()
    p = Plan.model_validate(service["status"]["plan"])
    step = predicted_step_seconds(p, 1)
    address = ready_server_address(
        "svc-0", {}, {"podIP": "10.1.1.1", "conditions": [{"type": "Ready", "status": "True"}]}
    )
    kopf_indexes = indexes(service, {("ns", "svc"): [address]})
    reconciler = Reconciles()
    state = state_around(reconciler)
    readings = iter([(0, 0.0), (600, 600 * step), (1200, 1200 * step), (1800, 1200 * step + 600 * step * 4)])
    clock = iter([0.0, 60.0, 120.0, 180.0])

    def read(ip: str, port: int) -> dict[str, float]:
        assert (ip, port) == ("10.1.1.1", spec().service.port)
        tokens, seconds = next(readings)
        return wanted_series(metrics_text(tokens=tokens, seconds=seconds, running=1, cpus=p.cpu))

    async def rounds() -> None:
        for _ in range(4):
            await performance.check_round(state, kopf_indexes, read, lambda: next(clock))

    asyncio.run(rounds())
    verdicts = state.performance.verdicts[("ns", "svc")]
    assert (verdicts.ok, verdicts.reason) == (False, "SlowerThanPredicted")
    # The first reading makes no window; the second is as predicted (a reconcile), the third too (none), the fourth
    # runs at a quarter of the speed (a reconcile).
    assert [(v.ok, v.reason) for v in reconciler.verdicts] == [(True, "AsPredicted"), (False, "SlowerThanPredicted")]

    # The server replaced (its pod gone, the new one not ready yet): the verdict on it goes, and so does the condition.
    asyncio.run(performance.check_round(state, indexes(service, {}), read, lambda: 240.0))
    assert not state.performance.verdicts and reconciler.verdicts[-1] is None


def test_a_server_whose_metrics_cannot_be_read_is_skipped_for_more_rounds_each_time():
    service = planned_service()
    address = ready_server_address(
        "svc-0", {}, {"podIP": "10.1.1.1", "conditions": [{"type": "Ready", "status": "True"}]}
    )
    state = state_around(Reconciles())
    reads = []

    def read(ip: str, port: int) -> dict[str, float]:
        reads.append(ip)
        raise MetricsUnreadable("http://10.1.1.1:8000/metrics: connection refused")

    async def rounds(count: int) -> None:
        for _ in range(count):
            await performance.check_round(state, indexes(service, {("ns", "svc"): [address]}), read, lambda: 0.0)

    asyncio.run(rounds(1 + 2 + 1 + 4 + 1))  # read, 2 skipped, read, 4 skipped, read
    assert len(reads) == 3
    assert state.performance.unreadable == {("ns", "svc-0"): "http://10.1.1.1:8000/metrics: connection refused"}
    assert not state.performance.samples and not state.performance.verdicts
    asyncio.run(performance.check_round(state, indexes(service, {}), read, lambda: 0.0))  # no longer ready
    assert not state.performance.unreadable and not state.performance.backoff


def test_a_server_that_answers_no_http_is_unreadable_not_a_failed_round():
    """The image is a tenant's: a /metrics that is not HTTP (here a bare line) must not escape as another error."""
    import socket
    import threading

    from cpullm.io.server_metrics import read_metrics

    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(b"not http at all\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    with listener, pytest.raises(MetricsUnreadable, match=r"127\.0\.0\.1"):
        read_metrics("127.0.0.1", listener.getsockname()[1], timeout=5)


def nested_too_deep(spec: dict[str, Any]) -> None:
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"a": deep}
    spec["model"]["config"] = deep


def metrics_behind_the_key(spec: dict[str, Any]) -> None:
    spec["apiKeySecret"] = {"name": "key", "metrics": "key"}


@pytest.mark.parametrize("change", [nested_too_deep, metrics_behind_the_key])
def test_a_service_whose_servers_the_check_cannot_read_is_left_out_and_the_round_goes_on(change):
    """The check reads a spec as the reconciles do (parse_spec: its depth bounded first), so a spec its reconcile
    refuses (InvalidSpec) has no servers judged either; nor has one whose servers' /metrics need the API key
    (spec.apiKeySecret.metrics: key), which the operator never reads. The round goes on."""
    service = planned_service()
    change(service["spec"])
    address = ready_server_address(
        "svc-0", {}, {"podIP": "10.1.1.1", "conditions": [{"type": "Ready", "status": "True"}]}
    )
    state = state_around(Reconciles())

    def read(ip: str, port: int) -> dict[str, float]:
        raise AssertionError("a server the check cannot read is not asked")

    asyncio.run(performance.check_round(state, indexes(service, {("ns", "svc"): [address]}), read, lambda: 0.0))
    assert state.performance.parsed[("ns", "svc")][1] is None and not state.performance.verdicts
