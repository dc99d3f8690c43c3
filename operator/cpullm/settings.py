"""Everything the operator and the CLI read from their environment and flags, in one object.

Environment variables carry the prefix `CPULLM_` (e.g. `CPULLM_HUB_TIMEOUT_SECONDS=20`). The Hub's own
conventions `HF_ENDPOINT` and `HF_TOKEN` are accepted too, so a mirror configured for other Hugging Face
tools works here as well. Flags of `cpullm run` override the environment.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AliasChoices, Field, StringConstraints, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cpullm.api.spec import IMAGE_REFERENCE_PATTERN, NetworkPolicyPeer
from cpullm.core.constants import DEFAULT_ROUTER_IMAGE, IMAGE_ARCH_SUFFIX
from cpullm.core.observation import OperatorPolicy

# An image an administrator names: a reference as a spec's image field takes one.
ImageReference = Annotated[str, StringConstraints(pattern=IMAGE_REFERENCE_PATTERN, max_length=1024)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CPULLM_", populate_by_name=True, extra="ignore")

    hf_endpoint: str = Field(
        default="https://huggingface.co",
        validation_alias=AliasChoices("CPULLM_HF_ENDPOINT", "HF_ENDPOINT"),
        description="Hugging Face Hub (or mirror) that model configs are fetched from when a spec has no "
        "inline config.",
    )
    hf_token: str | None = Field(
        default=None,
        validation_alias=AliasChoices("CPULLM_HF_TOKEN", "HF_TOKEN"),
        description="Offline only (`cpullm plan/render`): the Hub token standing in for a spec's "
        "hfTokenSecret. The operator reads the secret the spec names instead.",
    )
    read_any_secret: bool = Field(
        default=False,
        description="Read whichever Secret a spec's hfTokenSecret names. By default the operator reads only "
        "Secrets labelled cpullm.io/hf-token=true, so whoever may create a CpuLLMService cannot have the "
        "operator read a Secret of their namespace they could not read themselves.",
    )
    performance_check_seconds: float = Field(
        default=60.0,
        ge=0,
        description="How often the ready servers' /metrics are read to judge their speed against their plan's "
        "(the PerformanceAsPredicted condition); 0: never.",
    )
    hub_allow_http: bool = Field(
        default=False,
        description="Accept an http:// Hub endpoint (a mirror on a trusted network); by default only https.",
    )
    hub_timeout_seconds: float = Field(default=10.0, gt=0, description="Timeout of one Hub request.")
    hub_cache_seconds: float = Field(
        default=3600.0, ge=0, description="How long a fetched model config is reused before it is fetched again."
    )
    namespace_cache_seconds: float = Field(
        default=10.0,
        ge=0,
        description="How long a namespace's Pod Security labels and termination are reused before being read "
        "again (0: read on every reconcile).",
    )
    resync_seconds: float = Field(
        default=300.0,
        ge=0,
        description="How often the owned children of every served kind are listed to find any deleted or "
        "changed by another writer while no watch could tell, and the kinds that are not watched at all (an "
        "InferencePool, a PodDisruptionBudget): they are applied again; 0: never.",
    )
    # 8 and 32 converged 1,000 services alike on 2 CPUs (88.0/60.5 s, then 75.1/76.8 s: run-to-run noise), with
    # the same peak RSS: the fewer threads and API connections win.
    reconcile_workers: int = Field(
        default=8,
        ge=1,
        le=256,
        description="How many services are reconciled at once, each on its own thread and API connection; "
        "the others wait holding nothing (more: a burst converges faster, at more memory and API load).",
    )
    node_cache_dir: str | None = Field(
        default=None,
        pattern=r"^/[A-Za-z0-9._/-]*$",
        max_length=512,
        description="A directory on every node under which services asking for spec.modelCache.nodeLocal keep "
        "their weights (per namespace UID and model) and compile cache (per service UID), hostPaths the operator "
        "chooses, never the tenant, with no size limit, that nothing removes (cpullm node-cache-stale lists what "
        "to); unset: nodeLocal is refused.",
    )
    namespaces: list[str] = Field(
        default_factory=list, description="Namespaces to watch (`cpullm run -n`); empty: the whole cluster."
    )
    peering: str | None = Field(
        default=None, description="Kopf peering name, for several operator replicas; unset: standalone."
    )
    liveness: str | None = Field(
        default=None, description="Health endpoint to serve, e.g. http://0.0.0.0:8080/healthz (`--liveness`)."
    )
    verbose: bool = Field(default=False, description="Debug logging, including Kopf's per-handler lines.")
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Serve the operator's Prometheus metrics on this port (`--metrics-port`).",
    )
    router_image: ImageReference = Field(
        default=DEFAULT_ROUTER_IMAGE,
        description="HAProxy image of the router of every service whose spec.routing.router.image is unset (chart: "
        "router.image). Pin it by digest (repo@sha256:...): a tag can move, and routers started later would run "
        "another build.",
    )
    vllm_images: dict[str, ImageReference] = Field(
        default_factory=dict,
        description=f"vLLM CPU image per node arch (JSON, keys {' and '.join(IMAGE_ARCH_SUFFIX)}) of every service "
        "whose spec.image is unset (chart: vllm.images); an arch left out runs vLLM's published image of the "
        "operator's vLLM version. Pin them by digest (repo@sha256:...): a tag can move, and servers started later "
        "would run another build.",
    )

    numa_seccomp_profile: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$",
        max_length=256,
        description="A seccomp profile on every node, its path under the kubelet's seccomp root (chart: "
        "numaSeccomp, which installs cpullm/numa.json): the runtime's default plus vLLM's NUMA calls. Servers in "
        "namespaces enforcing Pod Security baseline or restricted run under it with every capability dropped, "
        "instead of being refused for the SYS_NICE capability; unset: they are refused, or run without NUMA "
        "calls (spec.numaPrivileges: false).",
    )
    max_concurrent_rollouts: int = Field(
        default=5,
        ge=0,
        le=10000,
        description="How many services may roll their servers out at once for a pod template change their spec did "
        "not ask for: an operator upgrade, an admin setting (router or vLLM image), a node's facts (chart: "
        "rollouts.maxConcurrent). The others keep serving their current template, condition RolloutPaced, until a "
        "slot is free; a change to a service's own spec rolls out at once. 0: no limit.",
    )

    operator_peer: NetworkPolicyPeer | None = Field(
        default=None,
        description="The operator's own pods as a NetworkPolicy peer (chart: this release's pods in its namespace): "
        "the servers' NetworkPolicies admit it on their API port, where the performance check reads /metrics. "
        "Unset: not admitted (an operator outside the cluster reaches pods from their node, which NetworkPolicy "
        "admits).",
    )

    def policy(self) -> OperatorPolicy:
        """The administrator's choices every reconcile reads (core/observation.py)."""
        return OperatorPolicy(
            node_cache_dir=self.node_cache_dir,
            router_image=self.router_image,
            vllm_images=self.vllm_images,
            numa_seccomp_profile=self.numa_seccomp_profile,
            max_concurrent_rollouts=self.max_concurrent_rollouts or None,
            operator_peer=self.operator_peer if self.performance_check_seconds > 0 else None,
        )

    @field_validator("vllm_images")
    @classmethod
    def _known_archs(cls, images: dict[str, str]) -> dict[str, str]:
        """A misspelt arch would otherwise leave that arch's servers on the default image, silently."""
        unknown = sorted(set(images) - set(IMAGE_ARCH_SUFFIX))
        if unknown:
            raise ValueError(f"unknown arch {', '.join(unknown)}: the keys are {', '.join(IMAGE_ARCH_SUFFIX)}")
        return images
