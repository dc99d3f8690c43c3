"""Every Kopf setting the operator changes from Kopf's defaults, each with its reason, and the operator's state
built once at start-up (controller/handlers.py's `configure` calls both)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import kopf

from cpullm.controller import discovery_wait
from cpullm.controller.gateway import GatewayReconciler
from cpullm.controller.memory import OperatorMemory
from cpullm.controller.pacing import RolloutPacer
from cpullm.controller.reconcile import Reconciler
from cpullm.controller.state import ControllerState
from cpullm.controller.workers import ReconcileWorkers
from cpullm.core.children.common import MANAGED_BY, MANAGED_BY_LABEL
from cpullm.core.node_facts import SOURCE_OF_PLURAL
from cpullm.io.hub import HubClient
from cpullm.io.kube import Kube
from cpullm.settings import Settings


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf's diff base, left empty. Kopf builds an essence of every object at every event (a deep copy, then a
    diff) for change handlers and daemons; this operator has neither (event handlers and indexes read the objects
    themselves). A spec nested deeper than copy.deepcopy reaches stopped each event of that service before any
    handler ran (no status, a traceback per event), and with 100 services arriving the essences of their events
    were ~4% of the operator's time (bench/scale_bench.py under py-spy)."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def apply(settings: kopf.OperatorSettings, watched: Iterable[tuple[str, str, str]]) -> None:
    """Kopf's settings; `watched`: the resources watched by the operator's label selector (children, server pods)."""
    settings.persistence.diffbase_storage = NoDiffBase()
    # Kopf's resource scanning stays on (its default): a NodeResourceTopology CRD installed after the operator is
    # watched from then on. It lists and watches CRDs, which the operator reads anyway (optional APIs); in
    # watched-namespace mode it cannot list Namespaces (no RBAC) and keeps to the namespaces it was given. Kopf
    # reads a new CRD's kind from discovery at the CRD's events only, which can precede discovery: it waits for it.
    discovery_wait.install()
    logging.getLogger("kopf._core.reactor.observation").addFilter(_optional_node_facts_unresolved)
    # Our own events say what was decided; Kopf's per-handler events would double them. Kopf still posts
    # its warnings and errors.
    settings.posting.level = logging.WARNING
    # Kopf retries a failed API request, a watch included, on these delays and then gives up (a watch that
    # gives up stops the operator). Its default sums to 54 s, about what an API server restart takes, and
    # waits up to 21 s between tries; these ride out about 4 minutes of outage and notice the API server back
    # within 10 s (measured: 50 services settled 62 s after a 30 s outage with 30 s steps), then the
    # operator's liveness probe gets it restarted.
    settings.networking.error_backoffs = [1, 2, 3, 5, *[10] * 24]
    # Watches are re-opened every 5 minutes (default: never), so a stream silently dropped by a proxy or load
    # balancer is noticed; the client waits a little longer than the server, which ends the request cleanly.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Children are watched with a server-side label selector: the API server sends only objects the operator
    # owns, not every Deployment, Service and ConfigMap of the cluster (the handlers' `labels=` filter alone
    # is applied client-side, after the whole stream arrived).
    for resource in watched:
        settings.watching.label_selectors[resource] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


def controller_state(config: Settings) -> ControllerState:
    """The reconciler (its Kubernetes API and Hub clients), its worker threads, and the memory and pacer it shares
    with dispatch."""
    hub = HubClient(
        config.hf_endpoint, config.hub_timeout_seconds, config.hub_cache_seconds, allow_http=config.hub_allow_http
    )
    # One API connection per reconcile thread, and one for the resync's lists.
    kube = Kube.from_environment(connections=config.reconcile_workers + 1, read_any_secret=config.read_any_secret)
    policy = config.policy()
    memory, pacer = OperatorMemory(), RolloutPacer(policy.max_concurrent_rollouts)
    reconciler = Reconciler(
        kube,
        hub,
        namespace_cache_seconds=config.namespace_cache_seconds,
        policy=policy,
        memory=memory,
        pacer=pacer,
        adapters=hub,  # the Hub tells a LoRA adapter's rank too
    )
    state = ControllerState(reconciler, ReconcileWorkers(config.reconcile_workers), memory, pacer, kube)
    state.gateways = GatewayReconciler(kube, policy.router_image)
    return state


def _optional_node_facts_unresolved(record: logging.LogRecord) -> bool:
    """Kopf warns of every watched resource the cluster does not serve; the node-fact sources are optional (nodes
    are then planned from their labels alone), so that warning is not logged when it names only them."""
    message = record.getMessage()
    if not message.startswith("Unresolved resources cannot be served"):
        return True
    named = sum(f"='{plural}'" in message for plural in SOURCE_OF_PLURAL)
    return not (0 < message.count("Selector(") <= named)
