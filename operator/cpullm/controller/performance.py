"""The performance check's rounds: every `performance_check_seconds`, each ready server pod's /metrics is read
(io/server_metrics.py), its window since the last reading is worked out, and each service's servers are judged
against its plan (core/performance_check.py). A service is reconciled only when its verdict flips or changes its
reason, so its status and events follow (PerformanceAsPredicted); its reconciles read the latest verdict whatever
woke them. The operator must reach the pods' API port: the servers' NetworkPolicy admits metricsFrom there."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from cpullm.api.crd import parse_stored_spec
from cpullm.api.plan import Plan
from cpullm.controller.dispatch import reconcile_quietly
from cpullm.controller.indexes import KopfIndexes
from cpullm.controller.state import ControllerState
from cpullm.core.performance_check import ServerAddress, ServerSample, Window, judge, window
from cpullm.errors import CpuLLMError
from cpullm.io.server_metrics import MetricsUnreadable, read_metrics
from cpullm.metrics import SPEED_SHARE

log = logging.getLogger(__name__)
READS_AT_ONCE = 16  # on threads of the check's own, so slow pods never hold the threads reconciles wait on
READ_TIMEOUT_SECONDS = 3.0
# A pod whose /metrics could not be read is skipped for 2, 4, ... rounds after each failure, at most this many: an
# address that drops packets costs a read's timeout, and a cluster of thousands of them must not fill every round.
MAX_SKIPPED_ROUNDS = 16
Reader = Callable[[str, int], dict[str, float]]


def _plan_and_port(service: Mapping[str, Any]) -> tuple[Plan, int] | None:
    """The plan the service's servers run and their API port; None when it has no plan, its spec does not parse, or
    its servers' /metrics need the API key, which the operator never reads."""
    try:
        plan = Plan.model_validate((service.get("status") or {}).get("plan"))
        spec = parse_stored_spec(service.get("spec"))  # as a reconcile reads it: depth bounded, newer fields dropped
    except (ValidationError, CpuLLMError):
        return None
    if spec.metrics_need_key:
        return None
    return plan, spec.service.port


def _read_quickly(address: str, port: int) -> dict[str, float]:
    return read_metrics(address, port, timeout=READ_TIMEOUT_SECONDS)


async def check_round(
    state: ControllerState,
    indexes: KopfIndexes,
    read: Reader = _read_quickly,
    clock: Callable[[], float] = time.monotonic,
    threads: Executor | None = None,
) -> None:
    """One round over every service with ready servers (`threads`: where the reads run; None: asyncio's default)."""
    watch = state.performance
    loop = asyncio.get_running_loop()
    targets: list[tuple[tuple[str, str], ServerAddress, int]] = []
    plans: dict[tuple[str, str], Plan] = {}
    gate = asyncio.Semaphore(READS_AT_ONCE)
    owned = {key: indexes.owned_pods(indexes.server_addresses, key) for key in list(indexes.server_addresses)}
    for key, store in owned.items():
        service = next(iter(indexes.service(key)), None)
        if service is None:
            continue
        version = (service.get("metadata") or {}).get("resourceVersion")
        cached = watch.parsed.get(key)
        if cached is None or cached[0] != version or version is None:  # parsed once per version of the object
            cached = watch.parsed[key] = (version, _plan_and_port(service))
        found = cached[1]
        if found is None:
            continue
        plans[key], port = found
        for address in list(store):
            pod = (key[0], address.pod)
            failures, skipped = watch.backoff.get(pod, (0, 0))
            if skipped < min(2**failures, MAX_SKIPPED_ROUNDS) and failures:
                watch.backoff[pod] = (failures, skipped + 1)
                watch.samples.pop(pod, None)  # the next window starts at the next reading
                continue
            targets.append((key, address, port))

    async def reading(address: ServerAddress, port: int) -> dict[str, float] | str:
        async with gate:
            try:
                return await loop.run_in_executor(threads, read, address.ip, port)
            except MetricsUnreadable as error:
                return str(error)

    readings = await asyncio.gather(*(reading(address, port) for _, address, port in targets))
    windows: dict[tuple[str, str], list[Window]] = {}
    judged: dict[tuple[str, str], set[tuple[str, str]]] = {}  # the pods each service's windows are of
    seen: set[tuple[str, str]] = set()
    for (key, address, _), answer in zip(targets, readings, strict=True):
        pod = (key[0], address.pod)
        seen.add(pod)
        sample = ServerSample.of(answer, clock()) if isinstance(answer, dict) else None
        if sample is None:
            why = answer if isinstance(answer, str) else "its /metrics holds no vLLM inter-token latency"
            if watch.unreadable.get(pod) != why:
                log.info("performance check: pod %s/%s: %s", *pod, why)
                watch.unreadable[pod] = why
            watch.backoff[pod] = (watch.backoff.get(pod, (0, 0))[0] + 1, 0)
            watch.samples.pop(pod, None)
            continue
        watch.unreadable.pop(pod, None)
        watch.backoff.pop(pod, None)
        before = watch.samples.get(pod)
        watch.samples[pod] = sample
        between = window(before, sample) if before is not None else None
        if between is not None:
            windows.setdefault(key, []).append(between)
            judged.setdefault(key, set()).add(pod)
    addresses = {(key[0], a.pod) for key, store in owned.items() for a in store}
    for pod in [p for p in watch.samples if p not in seen]:  # not read this round
        del watch.samples[pod]
    for table in (watch.backoff, watch.unreadable):
        for pod in [p for p in table if p not in addresses]:  # gone, or no longer ready
            del table[pod]
    woken = []
    for key, found_windows in windows.items():
        verdict = judge(plans[key], found_windows)
        if verdict is None:
            continue
        SPEED_SHARE.labels(namespace=key[0], service=key[1]).set(verdict.speed_share)
        last = watch.verdicts.get(key)
        watch.verdicts[key], watch.judged[key] = verdict, frozenset(judged[key])
        if last is None or (last.ok, last.reason) != (verdict.ok, verdict.reason):
            woken += indexes.service(key)
    for key in list(watch.verdicts):
        # A verdict stands while a server it judged is ready: one on servers that are all gone (replaced, scaled to
        # zero) says nothing of those that run now, so its condition goes.
        gone = key not in indexes.services
        if gone or not watch.judged[key] & addresses:
            del watch.verdicts[key], watch.judged[key]
            SPEED_SHARE.remove(*key)
            woken += [] if gone else indexes.service(key)
    for key in [k for k in watch.parsed if not owned.get(k)]:  # no ready server, or gone
        del watch.parsed[key]
    if woken:
        await reconcile_quietly(state, woken, indexes)


async def check_forever(state: ControllerState, indexes: KopfIndexes, every: float) -> None:
    """A round that fails in a way no one foresaw is logged with its traceback; the rounds go on."""
    with ThreadPoolExecutor(READS_AT_ONCE, thread_name_prefix="performance-check") as threads:
        while True:
            await asyncio.sleep(every)
            try:
                await check_round(state, indexes, threads=threads)
            except Exception:
                log.exception("performance check round failed; the next one is due in %.0f s", every)
