"""The operator's state between Kopf events, typed (Kopf's memo holds one ControllerState, `state`, and the
Settings the operator was run with, `settings`).

One rule tells an event's news from noise for every watch that triggers reconciles of other objects (nodes,
DaemonSets, server pods, optional APIs' CRDs): LastSeen keeps what each object was when the services were last
reconciled against it. An event is news when that changed; in the operator's first listing (Kopf's event type
None for an object it has not seen) it is not, because the services' own first listing reconciles every service.
A re-listing after a failed watch (type None, object known) is news like any other event.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from cpullm.api.plan import Plan
from cpullm.controller.memory import OperatorMemory
from cpullm.controller.pacing import RolloutPacer
from cpullm.controller.reconcile import KubeGateway, Reconciler
from cpullm.controller.workers import ReconcileWorkers
from cpullm.core.daemonsets import DaemonPods
from cpullm.core.performance_check import PerformanceVerdict, ServerSample
from cpullm.core.pod_troubles import PodTrouble
from cpullm.core.server_exits import ServerExit
from cpullm.core.topology import NodeState, node_state_changed
from cpullm.metrics import Prediction

if TYPE_CHECKING:
    from cpullm.controller.gateway import GatewayReconciler

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class Change(Generic[V]):
    before: V | None
    after: V | None


@dataclass
class LastSeen(Generic[K, V]):
    """What each watched object was (None: gone, never seen, or nothing worth keeping), and whether an event
    changed it (`changed`: by default, any difference)."""

    changed: Callable[[V | None, V | None], bool] = operator.ne
    values: dict[K, V | None] = field(default_factory=dict)

    def news(self, key: K, event_type: str | None, value: V | None) -> Change[V] | None:
        """Record the object as this event shows it (a DELETED one is None, whatever its last body said); the
        change, when it is news."""
        first_sight = key not in self.values
        before = self.values.pop(key, None)
        if event_type == "DELETED":
            value = None
        else:
            self.values[key] = value
        if (event_type is None and first_sight) or not self.changed(before, value):
            return None
        return Change(before, value)


class RetryScheduler:
    """At most one pending retry per service, the soonest asked for: it reads the latest facts when it runs,
    whichever events failed before."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, str], tuple[float, asyncio.Task[None]]] = {}
        self.running: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps weak references)

    def later(self, key: tuple[str, str], delay: float, retry: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if key in self.pending:
            if self.pending[key][0] <= due:
                return
            self.pending[key][1].cancel()

        async def again() -> None:
            await asyncio.sleep(delay)
            del self.pending[key]  # from here on, a failure schedules the next retry
            await retry()

        task = loop.create_task(again())
        self.pending[key] = (due, task)
        self.running.add(task)
        task.add_done_callback(self.running.discard)


@dataclass
class PerformanceWatch:
    """What the performance check keeps between its rounds (controller/performance.py): each server pod's last
    reading, by (namespace, pod), and each service's last verdict and the pods it judged, by (namespace, name), which
    its reconciles report (core/performance_check.py)."""

    samples: dict[tuple[str, str], ServerSample] = field(default_factory=dict)
    verdicts: dict[tuple[str, str], PerformanceVerdict] = field(default_factory=dict)
    judged: dict[tuple[str, str], frozenset[tuple[str, str]]] = field(default_factory=dict)  # the verdicts' pods
    # Each service's plan and API port as last parsed, with the resourceVersion they were parsed from.
    parsed: dict[tuple[str, str], tuple[str | None, tuple[Plan, int] | None]] = field(default_factory=dict)
    # Why a pod's /metrics could not be read, as last logged, by (namespace, pod); and its failures in a row and the
    # rounds skipped since the last (controller/performance.py's backoff).
    unreadable: dict[tuple[str, str], str] = field(default_factory=dict)
    backoff: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)

    def predictions(self) -> dict[tuple[str, str], Prediction]:
        """The predicted speed of each service with servers the check reads (cpullm_predicted_*); called from the
        metrics server's thread, so it reads a copy."""
        found = {}
        for key, (_, parsed) in list(self.parsed.items()):
            predicted = parsed[0].predicted if parsed is not None else None
            if predicted is not None:
                found[key] = Prediction(
                    predicted.decode_tokens_per_second,
                    predicted.throughput_tokens_per_second,
                    predicted.throughput_streams,
                    predicted.time_to_first_token_seconds,
                    predicted.prompt_tokens,
                )
        return found


@dataclass
class ControllerState:
    """The controller's state, one owner per piece, side by side: dispatch calls each by its own name. The
    reconciler writes the memory and takes slots of the pacer as it reconciles; dispatch asks the memory whether
    an event is news and the pacer whom to wake, and emits its own events and listings through `kube`."""

    reconciler: Reconciler
    workers: ReconcileWorkers
    memory: OperatorMemory  # what was applied and written, and which reconcile read the newest facts
    pacer: RolloutPacer  # the rollouts under way and the services waiting for a slot
    kube: KubeGateway  # the reconciler's API client, for the events and listings dispatch makes
    nodes: LastSeen[str, NodeState] = field(default_factory=lambda: LastSeen(node_state_changed))
    daemonsets: LastSeen[tuple[str, str], DaemonPods] = field(default_factory=LastSeen)
    pod_troubles: LastSeen[tuple[str, str], PodTrouble] = field(default_factory=LastSeen)  # why a pod cannot run
    server_exits: LastSeen[tuple[str, str], ServerExit] = field(default_factory=LastSeen)  # fixes not loaded
    served_optional_apis: LastSeen[str, bool] = field(default_factory=LastSeen)  # True: served
    # Why a node-fact source's object of a node cannot be read, as last logged, by (its kind, the node) (None: it
    # can, or it is gone).
    node_fact_problems: dict[tuple[str, str], str | None] = field(default_factory=dict)
    retries: RetryScheduler = field(default_factory=RetryScheduler)
    resync: asyncio.Task[None] | None = None
    performance: PerformanceWatch = field(default_factory=PerformanceWatch)
    performance_check: asyncio.Task[None] | None = None
    gateways: GatewayReconciler | None = None  # the CpuLLMGateways' (controller/gateway.py)
    gateway_resync: asyncio.Task[None] | None = None

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """Drop what each owner keeps of a deleted service (its children go by garbage collection)."""
        self.reconciler.forget(namespace, name)
        self.memory.forget(namespace, name, uid)
        self.pacer.forget((namespace, name))
