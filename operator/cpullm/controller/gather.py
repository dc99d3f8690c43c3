"""Gather: read everything one reconcile needs, before anything is decided (see core/decision.py).

The operator gathers from the cluster (io/kube.py) and the Hub (io/hub.py); the CLI gathers the same facts
from files (io/files.py). Both go through `gather`, so a model is resolved by one set of rules:
1. an inline `spec.model.config` wins (what the user wrote is the truth);
2. else the model source is asked (the Hub for the operator; a config file or the Hub for the CLI), with the
   token of `spec.hfTokenSecret` when the spec names one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from cpullm.api.spec import CpuLLMServiceSpec, SizedBy, name_problem, parse_spec
from cpullm.controller.vllm_sizing import JobSizer, SizingJobs
from cpullm.core.children.common import Owner
from cpullm.core.children.sizing_job import VllmSizing
from cpullm.core.node_facts import refine_profiles
from cpullm.core.observation import DEFAULT_POLICY, ClusterView, NamespaceFacts, Observed, OperatorPolicy
from cpullm.core.sizing import ModelFiles, ModelSize, size_model
from cpullm.core.sizing.vllm_report import VllmSizer
from cpullm.errors import CpuLLMError, InvalidSpec, ModelConfigUnavailable, UnexpectedError

log = logging.getLogger(__name__)


class ClusterFacts(Protocol):
    """The cluster reads a reconcile makes (beyond what Kopf's indexes hold)."""

    def read_namespace(self, namespace: str) -> NamespaceFacts: ...
    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None: ...


class ModelConfigSource(Protocol):
    """Where a model's config.json (and safetensors index) come from when the spec has no inline config."""

    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles: ...


class AdapterConfigSource(Protocol):
    """Where a LoRA adapter's rank is read (its adapter_config.json on the Hub); None: it cannot be told."""

    def adapter_rank(self, source: str, token: str | None) -> int | None: ...


@runtime_checkable
class SharedByNamespace(Protocol):
    """A source that shares what it holds among namespaces (the Hub client's readers): asked as one namespace."""

    def in_namespace(self, namespace: str) -> Any: ...


def as_namespace(source: Any, namespace: str) -> Any:
    """`source` as `namespace`'s reconciles ask it, where it shares by namespace; else itself."""
    return source.in_namespace(namespace) if isinstance(source, SharedByNamespace) else source


def check_adapter_ranks(spec: CpuLLMServiceSpec, token: str | None, adapters: AdapterConfigSource) -> None:
    """Refuses an adapter whose adapter_config.json gives a rank above the spec's: vLLM would refuse it (over the
    rendered --max-lora-rank), or hold more memory for it than the plan counts. A lower one is counted high, which
    is safe; one that cannot be read is taken as the spec says (docs/adapters.md)."""
    for index, adapter in enumerate(spec.adapters or []):
        rank = adapters.adapter_rank(adapter.source, token)
        if rank is not None and rank > adapter.rank:
            raise InvalidSpec(
                f"spec.adapters[{index}] ({adapter.name}): rank {adapter.rank}, but its adapter_config.json says "
                f"r={rank}: set rank: {rank}"
            )


def resolve_model(
    spec: CpuLLMServiceSpec,
    namespace: str,
    cluster: ClusterFacts,
    models: ModelConfigSource,
    vllm: VllmSizer | None = None,
    adapters: AdapterConfigSource | None = None,
) -> ModelSize:
    """The model's size; where `adapters` reads them, the adapters' ranks are checked too (one read of the token
    secret serves both)."""
    model = spec.model
    always = model.sized_by == SizedBy.VLLM
    checked = adapters if spec.adapters else None
    token = hf_token(spec, namespace, cluster) if model.config is None or checked is not None else None
    if model.config is not None:
        size = size_model(model.config, model.dtype, weights_bytes=model.weights_bytes, vllm=vllm, always_vllm=always)
    else:
        files = models.fetch(model.name, model.revision, token)
        size = size_model(
            files.config,
            model.dtype,
            weights_bytes=model.weights_bytes,
            checkpoint_total_bytes=files.checkpoint_total_bytes,
            tensors=files.tensors,
            vllm=vllm,
            always_vllm=always,
        )
    if checked is not None:
        check_adapter_ranks(spec, token, checked)
    return size


def hf_token(spec: CpuLLMServiceSpec, namespace: str, cluster: ClusterFacts) -> str | None:
    """The token of spec.hfTokenSecret, None where the spec names none."""
    if spec.hf_token_secret is None:
        return None
    ref = spec.hf_token_secret
    token = cluster.read_secret_key(namespace, ref.name, ref.key)
    if token is None:
        raise ModelConfigUnavailable(f"secret {namespace}/{ref.name} has no key {ref.key}")
    return token


def gather(
    service: Mapping[str, Any],
    view: ClusterView,
    *,
    last_status: Mapping[str, Any] | None,
    cluster: ClusterFacts,
    models: ModelConfigSource,
    adapters: AdapterConfigSource | None = None,
    policy: OperatorPolicy = DEFAULT_POLICY,
    vllm: VllmSizer | None = None,
    sizing_jobs: SizingJobs | None = None,
    read_spec: Callable[[Mapping[str, Any] | None], CpuLLMServiceSpec] = parse_spec,
) -> Observed:
    """The observation of one service in the cluster as `view` shows it. `last_status` is what the operator last
    wrote (None: use the object's own); errors that are about this service (bad spec, model unavailable) are
    observations, not raised. A model the formulas do not know is sized by `vllm` (the CLI's --vllm-python), else
    by a sizing Job where `sizing_jobs` reads them (the operator: controller/vllm_sizing.py); the adapters' ranks
    are checked where `adapters` reads them. Each node's profile from its labels is refined by what the view's
    other sources say of it (core/node_facts.py). `read_spec`: a file's spec refuses a field it does not know
    (parse_spec); the operator's drops a newer CRD's (api/crd.py parse_stored_spec)."""
    meta = service["metadata"]
    raw_spec = service.get("spec") or {}
    owner = Owner(name=meta["name"], namespace=meta.get("namespace") or "default", uid=meta.get("uid"))
    namespace = cluster.read_namespace(owner.namespace)
    spec: CpuLLMServiceSpec | CpuLLMError
    try:
        problem = name_problem(owner.name)
        if problem:
            raise InvalidSpec(problem)
        spec = read_spec(raw_spec)
    except CpuLLMError as err:
        spec = err
    model: ModelSize | CpuLLMError | None = None
    nodes = tuple(refine_profiles(view.nodes, view.node_facts))
    previous = last_status if last_status is not None else service.get("status") or {}
    job_sizer: JobSizer | None = None
    if isinstance(spec, CpuLLMServiceSpec) and not namespace.terminating:
        if vllm is None and sizing_jobs is not None:
            vllm = job_sizer = JobSizer(owner, spec, previous, nodes, sizing_jobs, policy.vllm_images)
        try:
            model = resolve_model(spec, owner.namespace, cluster, models, vllm, adapters)
        except CpuLLMError as err:
            model = err
        except Exception as err:  # a bug on some input: this service reports it, the others go on
            log.debug("sizing %s/%s failed", owner.namespace, owner.name, exc_info=True)
            model = UnexpectedError(f"sizing the model failed unexpectedly ({type(err).__name__}); retried")
    replicas = raw_spec.get("replicas", 0)
    return Observed(
        owner=owner,
        generation=int(meta.get("generation") or 0),
        spec=spec,
        requested_replicas=replicas if isinstance(replicas, int) else 0,
        namespace=namespace,
        model=model,
        nodes=nodes,
        daemons=tuple(view.daemons),
        deployment=view.deployment,
        pod_trouble=view.pod_trouble,
        server_exits=tuple(view.server_exits),
        performance=view.performance,
        status=previous,
        installed_crds=view.installed_crds,
        policy=policy,
        sizing=job_sizer.outcome if job_sizer is not None else VllmSizing(),
        gateways=tuple(view.gateways),
    )
