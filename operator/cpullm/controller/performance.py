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
from typing import Any

from pydantic import ValidationError

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.controller.dispatch import reconcile_quietly
from cpullm.controller.indexes import KopfIndexes
from cpullm.controller.state import ControllerState
from cpullm.core.performance_check import ServerAddress, ServerSample, Window, judge, window
from cpullm.errors import CpuLLMError
from cpullm.io.server_metrics import MetricsUnreadable, read_metrics
from cpullm.metrics import SPEED_SHARE

log = logging.getLogger(__name__)
READS_AT_ONCE = 16
Reader = Callable[[str, int], dict[str, float]]


def _plan_and_port(service: Mapping[str, Any]) -> tuple[Plan, int] | None:
    """The plan the service's servers run and their API port; None when it has no plan or its spec does not parse."""
    try:
        plan = Plan.model_validate((service.get("status") or {}).get("plan"))
        spec = CpuLLMServiceSpec.model_validate(service.get("spec") or {})
    except (ValidationError, CpuLLMError, ValueError):
        return None
    return plan, spec.service.port


async def check_round(
    state: ControllerState,
    indexes: KopfIndexes,
    read: Reader = read_metrics,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """One round over every service with ready servers."""
    watch = state.performance
    targets: list[tuple[tuple[str, str], ServerAddress, int]] = []
    plans: dict[tuple[str, str], Plan] = {}
    for key, store in list(indexes.server_addresses.items()):
        service = next(iter(indexes.service(key)), None)
        found = _plan_and_port(service) if service is not None else None
        if found is None:
            continue
        plans[key], port = found
        targets += [(key, address, port) for address in list(store)]
    gate = asyncio.Semaphore(READS_AT_ONCE)

    async def reading(address: ServerAddress, port: int) -> dict[str, float] | str:
        async with gate:
            try:
                return await asyncio.to_thread(read, address.ip, port)
            except MetricsUnreadable as error:
                return str(error)

    readings = await asyncio.gather(*(reading(address, port) for _, address, port in targets))
    windows: dict[tuple[str, str], list[Window]] = {}
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
            continue
        watch.unreadable.pop(pod, None)
        before = watch.samples.get(pod)
        watch.samples[pod] = sample
        between = window(before, sample) if before is not None else None
        if between is not None:
            windows.setdefault(key, []).append(between)
    for pod in [p for p in watch.samples if p not in seen]:  # gone, or no longer ready
        del watch.samples[pod]
    woken = []
    for key, found_windows in windows.items():
        verdict = judge(plans[key], found_windows)
        if verdict is None:
            continue
        SPEED_SHARE.labels(namespace=key[0], service=key[1]).set(verdict.speed_share)
        last = watch.verdicts.get(key)
        watch.verdicts[key] = verdict
        if last is None or (last.ok, last.reason) != (verdict.ok, verdict.reason):
            woken += indexes.service(key)
    for key in [k for k in watch.verdicts if k not in indexes.services]:  # the service is gone
        del watch.verdicts[key]
        SPEED_SHARE.remove(*key)
    if woken:
        await reconcile_quietly(state, woken, indexes)


async def check_forever(state: ControllerState, indexes: KopfIndexes, every: float) -> None:
    """A round that fails in a way no one foresaw is logged with its traceback; the rounds go on."""
    while True:
        await asyncio.sleep(every)
        try:
            await check_round(state, indexes)
        except Exception:
            log.exception("performance check round failed; the next one is due in %.0f s", every)
