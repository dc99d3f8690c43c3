"""The CpuLLMService spec: the one source of truth for the CRD schema (see api/crd.py) and for parsing.

Field descriptions become `kubectl explain` text. Checks that the API server can make (ranges, enums,
CEL rules in `json_schema_extra`) live here too, so a bad spec is refused at admission; the same rules run
again in pydantic when the CLI parses a file.
"""

from __future__ import annotations

import difflib
import functools
import re
import sys
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel, to_snake

from cpullm.api.isa import lscpu_name, typo_of
from cpullm.errors import InvalidSpec
from cpullm.vllm_support import GUARD_METRICS_ENV, LORA_RANKS, REPORT_ENV

GROUP = "cpullm.io"
VERSION = "v1alpha1"
KIND = "CpuLLMService"
PLURAL = "cpullmservices"
SINGULAR = "cpullmservice"
SHORT_NAME = "cpullm"
API_VERSION = f"{GROUP}/{VERSION}"

# One range list per rank, ranks separated by '|': "0-31|32-63", "0,2,4|1,3,5".
_CPU_LIST = r"\d+(-\d+)?(,\d+(-\d+)?)*"
EXPLICIT_BIND_PATTERN = rf"^{_CPU_LIST}(\|{_CPU_LIST})*$"
# A Kubernetes resource quantity (as the API server's own OpenAPI schemas write it).
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
# lscpu flag names: lower case letters, digits and '_'.
ISA_FLAG_PATTERN = r"^[A-Za-z0-9_]+$"


# Every child takes the service's name (the Deployment, the Service, the `app.kubernetes.io/instance` label), and a
# Service name is a DNS-1035 label: so is a CpuLLMService's name (a CEL rule on metadata.name, api/crd.py).
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME_LENGTH = 63
NAME_RULE = (
    f"a CpuLLMService name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters (lower-case letters, "
    "digits and '-', starting with a letter): its Service and labels take the name"
)


def name_problem(name: str) -> str | None:
    """Why the children cannot take this name (objects stored before the CRD's rule), or None."""
    if len(name) > MAX_NAME_LENGTH or re.match(NAME_PATTERN, name) is None:
        return f"metadata.name {name[:80]!r}: {NAME_RULE}"
    return None


M = TypeVar("M", bound=BaseModel)

# The API server stores integers as int64; a larger one can only come from a file the CLI reads, and would
# overflow the planner's float arithmetic (GiB in messages) or the YAML and JSON it writes.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, value: Any) -> Any:
        """Every integer of the spec, pass-through objects included, fits an int64 (as the API server's do)."""
        if _beyond_int64(value):
            raise ValueError(
                f"holds an integer beyond int64 ({INT64_MIN} to {INT64_MAX}), which Kubernetes cannot store"
            )
        return value


def _beyond_int64(value: Any) -> bool:
    stack = [value]
    while stack:  # iterative: a pass-through object may nest deeper than Python's recursion limit
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, int) and not INT64_MIN <= item <= INT64_MAX:
            return True
    return False


# An image reference as the container runtime parses it (the distribution reference grammar): an optional registry
# host and port, lowercase path components, an optional tag and an optional digest. A reference a pod could not
# pull (surrounding whitespace, an upper-case repository) is refused at admission instead of leaving the ReplicaSet
# unable to create pods.
_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE_PATTERN = (
    rf"^(?:{_HOST}/)?{_PATH}(?:/{_PATH})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-fA-F0-9]{32,})?$"
)


class DType(StrEnum):
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class KVCacheDType(StrEnum):
    AUTO = "auto"
    FP8 = "fp8"


class SeccompProfile(StrEnum):
    RUNTIME_DEFAULT = "RuntimeDefault"
    UNCONFINED = "Unconfined"


class Placement(StrEnum):
    TENSOR_PARALLEL = "tensorParallel"
    THROUGHPUT = "throughput"
    AUTO = "auto"


class Objective(StrEnum):
    THROUGHPUT = "throughput"
    LATENCY = "latency"


class SpeculativeMethod(StrEnum):
    AUTO = "auto"
    OFF = "off"
    NGRAM = "ngram"
    MTP = "mtp"


class SizedBy(StrEnum):
    AUTO = "auto"
    VLLM = "vllm"


class ThreadsBindMode(StrEnum):
    AUTO = "auto"
    NOBIND = "nobind"


class ModelSource(_Model):
    name: str = Field(
        min_length=1,
        max_length=1024,
        description="Hugging Face model id (org/name) or an absolute path inside the container "
        "(for example on the model cache volume, which is mounted at /models).",
    )
    revision: str | None = Field(
        default=None, max_length=256, description="Hugging Face revision (branch, tag or commit)."
    )
    dtype: DType = Field(
        default=DType.BFLOAT16,
        description="Weight and activation dtype passed to vLLM (--dtype). bfloat16 is recommended on CPU; "
        "float16 is discouraged by vLLM's CPU backend.",
    )
    config: dict[str, Any] | None = Field(
        default=None,
        description="The model's Hugging Face config.json (or the fields that size it: model_type, hidden_size, "
        "intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size, "
        "tie_word_embeddings, max_position_embeddings, the MoE, MLA and sliding-window fields, "
        "quantization_config; a multimodal model's text_config and vision_config). Sized by the family's "
        "formula. When absent the operator reads config.json and the safetensors headers from the Hugging Face "
        "Hub, and sizes the weights from the checkpoint's real bytes.",
    )
    weights_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Total weight bytes as vLLM holds them (the serving dtype, or the quantized checkpoint's "
        "bytes); overrides the size computed from the checkpoint or the config.",
    )
    sized_by: SizedBy = Field(
        default=SizedBy.AUTO,
        description="Who sizes the model: auto, the operator's formulas, and vLLM's own build on the meta device (a "
        "sizing Job in the service's vLLM image) for a family they do not know; vllm, vLLM's build for every model, "
        "the formulas' weights kept in the plan's notes as a check. weightsBytes overrides both.",
    )


# An adapter's name (the model a request names) and source (a Hub repository id, or an absolute path in the container).
ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ADAPTER_SOURCE = r"^(/[^,\s]*|[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)$"
MAX_ADAPTERS = 16
MAX_ADAPTER_RANK = LORA_RANKS[-1]  # vLLM's largest --max-lora-rank


class Adapter(_Model):
    """A LoRA adapter of the model, served under its own name (docs/adapters.md)."""

    name: str = Field(
        max_length=64,
        pattern=ADAPTER_NAME,
        description="The model name requests use for it (the request's 'model'); not the base model's name.",
    )
    source: str = Field(
        max_length=1024,
        pattern=ADAPTER_SOURCE,
        description="A Hugging Face repository id (org/name), downloaded by the server, or an absolute path in the "
        "container (the model cache is mounted at /models).",
    )
    rank: int = Field(
        ge=1,
        le=MAX_ADAPTER_RANK,
        description="The adapter's LoRA rank (r in its adapter_config.json): what the plan counts its memory by.",
    )


# The highest CPU id Linux numbers (NR_CPUS is at most 8192).
MAX_CPU_ID = 8191
# Cores per rank kept for the HTTP front end: a few at most on any node (one by default).
MAX_RESERVED_CPUS_PER_RANK = 256


def bind_overlap(bind: str) -> str | None:
    """What is wrong with an explicit thread binding's ranges, or None: a range that runs backwards, a CPU id Linux
    never numbers, or a CPU in two ranks (their OpenMP threads would share it). Checked by sorting the ranges, not
    by listing their CPUs: a hostile 4 KiB of ranges costs the same as a short one."""
    ranges: list[tuple[int, int, int]] = []
    for rank, cpus in enumerate(bind.split("|")):
        for part in cpus.split(","):
            first, _, last = part.partition("-")
            low, high = int(first), int(last or first)
            if low > high:
                return f"range {part} of rank {rank} runs backwards: write {high}-{low}"
            if high > MAX_CPU_ID:
                return f"CPU {high} of rank {rank}: Linux numbers CPUs up to {MAX_CPU_ID}"
            ranges.append((low, high, rank))
    ranges.sort()
    reach, reaching = -1, -1  # the highest CPU the ranges so far cover, and whose range it ends
    for low, high, rank in ranges:
        if low <= reach and rank != reaching:
            one, other = sorted((rank, reaching))
            return f"CPU {low} is in ranks {one} and {other}: give each rank its own CPUs"
        if high > reach:
            reach, reaching = high, rank
    return None


class CpuSettings(_Model):
    required_isa: list[Annotated[str, Field(pattern=ISA_FLAG_PATTERN, max_length=64)]] = Field(
        default_factory=list,
        max_length=64,
        alias="requiredISA",
        description="CPU flags every chosen node must have, as lscpu names (avx512f, avx512_bf16, amx_bf16, "
        "avx2, ...) or Node Feature Discovery's (AVX512BF16, AMXBF16): the plan uses lscpu's.",
    )
    reserved_cpus_per_rank: int | None = Field(
        default=None,
        ge=0,
        le=MAX_RESERVED_CPUS_PER_RANK,
        description="Cores per rank kept off OpenMP for the HTTP front end (VLLM_CPU_NUM_OF_RESERVED_CPU). "
        "Default: 1 when a rank has more than 2 physical cores, else 0.",
    )
    cpus_per_rank: int | None = Field(
        default=None,
        ge=1,
        description="Whole CPUs requested per rank. Default: every allocatable CPU of one NUMA node.",
    )
    threads_bind: str = Field(
        default=ThreadsBindMode.AUTO.value,
        max_length=4096,
        description="VLLM_CPU_OMP_THREADS_BIND. 'auto' binds rank N to the N-th NUMA node of the pod's "
        "cpuset (nodes labelled cpullm.io/cpu-manager-policy=none get 'nobind' instead); 'nobind' uses "
        "OMP_NUM_THREADS; an explicit list gives each rank's CPUs, ranks separated by '|' (e.g. "
        "'0-31|32-63'): use it only where the container's CPU ids are known.",
        pattern=rf"^(auto|nobind|{EXPLICIT_BIND_PATTERN[1:-1]})$",
    )
    launcher: bool = Field(
        default=True,
        description="Start vLLM through the operator's in-pod launcher: it binds each rank's threads to the CPUs "
        "and NUMA nodes the pod really got, and applies fixes to vLLM inside its processes (docs/vllm-versions.md). "
        "CPULLM_VLLM_FIXES_OFF in env names fixes to leave out: leave_page_cache_out, short_warm_up, "
        "rank_in_engine_core, engine_core_forked, aot_cache_loads, checkpoint_pages_dropped, amx_tile_permission, "
        "container_cpu_metrics. "
        "false runs vLLM's command as is.",
    )

    @field_validator("threads_bind", mode="after")
    @classmethod
    def _ranks_apart(cls, bind: str) -> str:
        if bind in (ThreadsBindMode.AUTO, ThreadsBindMode.NOBIND):
            return bind
        wrong = bind_overlap(bind)
        if wrong:
            raise ValueError(wrong)
        return bind

    @model_validator(mode="after")
    def _a_cpu_left_for_openmp(self) -> CpuSettings:
        reserved, cpus = self.reserved_cpus_per_rank, self.cpus_per_rank
        if reserved is not None and cpus is not None and reserved >= cpus:
            raise ValueError(
                f"reservedCpusPerRank {reserved} leaves none of cpusPerRank {cpus} for the model's OpenMP threads"
            )
        return self

    @field_validator("required_isa", mode="after")
    @classmethod
    def _lscpu_names(cls, flags: list[str]) -> list[str]:
        """NFD's spellings read as lscpu's (AMXBF16 -> amx_bf16); a near miss of a known flag refused with it."""
        names = [lscpu_name(flag) for flag in flags]
        for written, name in zip(flags, names, strict=True):
            meant = typo_of(name)
            if meant:
                raise ValueError(f"{written!r} is no CPU flag nodes report; did you mean {meant!r}?")
        return list(dict.fromkeys(names))


_CEL_TOLERATION: dict[str, JsonValue] = {
    "rule": "(!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute'))"
    " && (!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == '')",
    "message": "tolerationSeconds needs effect NoExecute, and operator Exists no value (the pod would be refused)",
}


class Toleration(_Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_CEL_TOLERATION]})

    key: str | None = Field(default=None, max_length=317, description="Taint key to tolerate (empty: any).")
    operator: str | None = Field(
        default=None, json_schema_extra={"enum": ["Exists", "Equal"]}, description="Exists or Equal (default)."
    )
    value: str | None = Field(default=None, max_length=63, description="Taint value, with operator Equal.")
    effect: str | None = Field(
        default=None,
        json_schema_extra={"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
        description="Taint effect to tolerate (empty: any).",
    )
    toleration_seconds: int | None = Field(
        default=None, description="With NoExecute: how long the pod stays bound after the taint appears."
    )

    @model_validator(mode="after")
    def _as_kubernetes_takes_it(self) -> Toleration:
        """What the API server would refuse in the Deployment (a ChildRejected after the plan), refused in the spec."""
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies only with effect NoExecute")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        return self


class NodeSelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class NodeSelectorRequirement(_Model):
    """One requirement of a node selector term, as the API server validates it in a pod
    (ValidateNodeSelectorRequirement): In and NotIn take values, Exists and DoesNotExist none, Gt and Lt one integer."""

    key: str = Field(min_length=1, max_length=317, description="The label key (or, in matchFields, metadata.name).")
    operator: NodeSelectorOperator = Field(description="In, NotIn, Exists, DoesNotExist, Gt or Lt.")
    values: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list, max_length=1024, description="The values the operator compares with."
    )

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> NodeSelectorRequirement:
        operator, values = self.operator, self.values
        if operator in (NodeSelectorOperator.IN, NodeSelectorOperator.NOT_IN) and not values:
            raise ValueError(f"values must be non-empty for operator {operator.value}")
        if operator in (NodeSelectorOperator.EXISTS, NodeSelectorOperator.DOES_NOT_EXIST) and values:
            raise ValueError(f"values must be empty for operator {operator.value}")
        if operator in (NodeSelectorOperator.GT, NodeSelectorOperator.LT) and (
            len(values) != 1 or not is_int64(values[0])
        ):
            raise ValueError(f"values must be one integer for operator {operator.value}")
        return self


def is_int64(text: str) -> bool:
    return re.fullmatch(r"[+-]?[0-9]{1,19}", text) is not None and INT64_MIN <= int(text) <= INT64_MAX


class NodeSelectorTerm(_Model):
    """Requirements ANDed; a term with none matches no node."""

    match_expressions: list[NodeSelectorRequirement] = Field(
        default_factory=list, max_length=64, description="Requirements on the node's labels."
    )
    match_fields: list[NodeSelectorRequirement] = Field(
        default_factory=list, max_length=64, description="Requirements on the node's fields (metadata.name)."
    )


class NodeSelector(_Model):
    node_selector_terms: list[NodeSelectorTerm] = Field(
        max_length=64, description="Terms ORed: a node matching any of them is selected."
    )


class NodeAffinity(_Model):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None,
        description="Nodes the pods must land on; also narrows the nodes the operator plans on, and is joined with "
        "the nodes it chose.",
    )
    preferred_during_scheduling_ignored_during_execution: list[dict[str, Any]] | None = Field(
        default=None, description="Preferred nodes, passed to the pods as written."
    )


class Affinity(_Model):
    """Pod affinity as in a pod spec. The operator reads the required node affinity; the rest is passed through."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity, as in a pod spec.")
    pod_affinity: dict[str, Any] | None = Field(default=None, description="Pod affinity, passed through.")
    pod_anti_affinity: dict[str, Any] | None = Field(default=None, description="Pod anti-affinity, passed through.")

    @property
    def required_node_terms(self) -> list[NodeSelectorTerm]:
        """The required node affinity's terms, ORed (none: any node)."""
        required = (
            self.node_affinity.required_during_scheduling_ignored_during_execution if self.node_affinity else None
        )
        return list(required.node_selector_terms) if required else []

    def as_pod_affinity(self) -> dict[str, Any]:
        """As a pod spec writes it."""
        return self.model_dump(by_alias=True, exclude_defaults=True)


class KeySelector(_Model):
    name: str = Field(min_length=1, max_length=253, description="The object's name, in the service's namespace.")
    key: str = Field(min_length=1, max_length=253, description="The key to select.")
    optional: bool | None = Field(default=None, description="Whether the object or its key may be missing.")


class ObjectFieldSelector(_Model):
    api_version: str | None = Field(default=None, max_length=64, description="The schema fieldPath is written in.")
    field_path: str = Field(min_length=1, max_length=256, description="A field of the pod, e.g. status.podIP.")


class ResourceFieldSelector(_Model):
    container_name: str | None = Field(default=None, max_length=63, description="The container (default: this).")
    resource: str = Field(min_length=1, max_length=64, description="A resource, e.g. limits.cpu.")
    divisor: str | None = Field(
        default=None, pattern=QUANTITY_PATTERN, max_length=64, description="The unit of the value."
    )


_VALUE_SOURCES = ("configMapKeyRef", "fieldRef", "resourceFieldRef", "secretKeyRef")
_CEL_ONE_VALUE_SOURCE: dict[str, JsonValue] = {
    "rule": " + ".join(f"(has(self.{source}) ? 1 : 0)" for source in _VALUE_SOURCES) + " == 1",
    "message": "valueFrom needs exactly one of " + ", ".join(_VALUE_SOURCES),
}


class EnvVarSource(_Model):
    """A container's env[].valueFrom, typed: a free-form object was passed to the pod unchecked (and a deeply
    nested one exhausted the operator's recursion)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_CEL_ONE_VALUE_SOURCE]})

    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None, description="A resource of a container.")
    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        chosen = [self.config_map_key_ref, self.field_ref, self.resource_field_ref, self.secret_key_ref]
        if sum(source is not None for source in chosen) != 1:
            raise ValueError(str(_CEL_ONE_VALUE_SOURCE["message"]))
        return self


class EnvVar(_Model):
    name: str = Field(min_length=1, max_length=256, description="Variable name (not one the operator owns).")
    value: str | None = Field(default=None, max_length=32768, description="Variable value.")
    value_from: EnvVarSource | None = Field(default=None, description="As in a container's env[].valueFrom.")


# The label a Secret carries to let the operator read it for a spec's hfTokenSecret (unless it is installed with
# readAnySecret): a tenant cannot point the operator at a Secret that did not opt in.
HF_TOKEN_SECRET_LABEL = "cpullm.io/hf-token"


class SecretKeyRef(_Model):
    name: str = Field(
        min_length=1,
        max_length=253,
        description=f"Secret in the service's namespace, labelled {HF_TOKEN_SECRET_LABEL}=true (the operator "
        "reads no other Secret unless installed with readAnySecret).",
    )
    key: str = Field(default="HF_TOKEN", max_length=253, description="Key holding the Hugging Face token.")


class MetricsAccess(StrEnum):
    OPEN = "open"
    KEY = "key"


class ApiKeySecretRef(_Model):
    name: str = Field(min_length=1, max_length=253, description="Secret in the service's namespace.")
    key: str = Field(default="api-key", max_length=253, description="Key holding the API key.")
    # No default in the CRD: the API server would write one into every stored apiKeySecret, which an operator of the
    # version before (its models forbid unknown fields) reads as an invalid spec while an upgrade rolls.
    metrics: MetricsAccess | None = Field(
        default=None,
        description="open (unset): /metrics answers without the key. key: it needs the key too (but from the pod "
        "itself); the PodMonitor sends it from this Secret, and the operator, which never reads the key, does not "
        "check the servers' speed (no PerformanceAsPredicted).",
    )


class PersistentVolumeClaimRef(_Model):
    claim_name: str = Field(min_length=1, max_length=253, description="PersistentVolumeClaim in the namespace.")


class EmptyDirCache(_Model):
    size_limit: str | None = Field(
        default=None, pattern=QUANTITY_PATTERN, max_length=64, description="Quantity, e.g. 50Gi."
    )


# The sources of a model cache, one of which a spec chooses: an object given, or a flag set (MODEL_CACHE_FLAGS).
MODEL_CACHE_SOURCES = ("persistentVolumeClaim", "emptyDir", "nodeLocal")
MODEL_CACHE_FLAGS = frozenset({"nodeLocal"})
_CEL_CACHE_ONE_OF: dict[str, JsonValue] = {
    "rule": " + ".join(
        f"(has(self.{source}){f' && self.{source}' if source in MODEL_CACHE_FLAGS else ''} ? 1 : 0)"
        for source in MODEL_CACHE_SOURCES
    )
    + " == 1",
    "message": "modelCache needs exactly one of " + ", ".join(MODEL_CACHE_SOURCES),
}


class ModelCache(_Model):
    """Where downloaded weights and what a start compiles live (mounted at /models: HF_HOME=/models/huggingface,
    VLLM_CACHE_ROOT=/models/vllm)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_CEL_CACHE_ONE_OF]})

    persistent_volume_claim: PersistentVolumeClaimRef | None = Field(
        default=None, description="A claim that keeps downloaded weights across pod restarts."
    )
    empty_dir: EmptyDirCache | None = Field(
        default=None, description="A pod-local directory; its sizeLimit is also the ephemeral-storage request."
    )
    node_local: bool = Field(
        default=False,
        description="A directory on each node, kept across pods, under the operator's nodeCacheDir (unset: "
        "NodeCacheDisabled): a server started again there finds the weights (per namespace UID and model) and what "
        "it compiled (per service UID). hostPath volumes with no size limit that nothing removes (`cpullm "
        "node-cache-stale` lists the stale ones); docs/tenancy.md.",
    )

    @property
    def kept_across_pods(self) -> bool:
        """Does a new pod find what an earlier one left here (a claim, the node's directory), not only a restarted
        container (an emptyDir)?"""
        return self.persistent_volume_claim is not None or self.node_local

    @model_validator(mode="after")
    def _one_source(self) -> ModelCache:
        """The CEL rule below, in Python: one table (MODEL_CACHE_SOURCES) for both."""
        if sum(bool(getattr(self, to_snake(source))) for source in MODEL_CACHE_SOURCES) != 1:
            raise ValueError(str(_CEL_CACHE_ONE_OF["message"]))
        return self


class Speculative(_Model):
    """Speculative decoding: a step proposes several tokens and the model checks them in one pass over its weights,
    which a CPU reads once per step whatever the batch (docs/speculative.md)."""

    method: SpeculativeMethod = Field(
        default=SpeculativeMethod.AUTO,
        description="auto: on where the plan predicts it faster for spec.objective (mtp where the checkpoint carries "
        "MTP layers; ngram for the latency objective), else off. off: never. ngram: tokens proposed from the "
        "prompt's own n-grams (no draft model). mtp: the checkpoint's multi-token-prediction layers propose. "
        "status.plan.speculative says what was chosen and why.",
    )
    tokens: int | None = Field(
        default=None,
        ge=1,
        le=8,
        description="Tokens proposed per step (vLLM's num_speculative_tokens). Default: the count from 1 to 4 the "
        "plan predicts best for spec.objective.",
    )


class ServiceSettings(_Model):
    port: int = Field(default=8000, ge=1, le=65535, description="Port of the OpenAI-compatible API.")
    type: str = Field(
        default="ClusterIP",
        json_schema_extra={"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
        description="The Service's type.",
    )


class Monitoring(_Model):
    pod_monitor: bool = Field(
        default=False,
        description="Create a PodMonitor (Prometheus Operator, monitoring.coreos.com/v1) scraping the vLLM pods' "
        "/metrics. Without the PodMonitor CRD the service gets the condition Monitoring=False, and the "
        "PodMonitor is applied as soon as the CRD is installed.",
    )
    interval: str = Field(default="30s", pattern=r"^[0-9]+(ms|s|m|h)$", description="Scrape interval.")


class LabelSelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(_Model):
    key: str = Field(min_length=1, max_length=317, description="A label key.")
    operator: LabelSelectorOperator = Field(description="How the label's value is compared with values.")
    values: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list, max_length=64, description="Values (In, NotIn); empty for Exists, DoesNotExist."
    )


class LabelSelector(_Model):
    """As in a NetworkPolicy peer (metav1.LabelSelector); empty: everything."""

    match_labels: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=64, description="Labels an object must have."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=16, description="Requirements an object's labels must meet."
    )


class IPBlock(_Model):
    cidr: str = Field(min_length=1, max_length=64, description="A CIDR, e.g. 10.0.0.0/8.")
    except_: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list, alias="except", max_length=32, description="CIDRs within cidr to leave out."
    )


_CEL_ONE_PEER_KIND: dict[str, JsonValue] = {
    "rule": "has(self.podSelector) || has(self.namespaceSelector) || has(self.ipBlock)",
    "message": "a peer needs podSelector, namespaceSelector or ipBlock",
}


class NetworkPolicyPeer(_Model):
    """As a NetworkPolicy's `from` or `to` entry: pods selected by labels (in the service's namespace, or in the
    namespaces namespaceSelector selects), or addresses."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_CEL_ONE_PEER_KIND]})

    pod_selector: LabelSelector | None = Field(default=None, description="Pods, by label.")
    namespace_selector: LabelSelector | None = Field(default=None, description="Namespaces, by label.")
    ip_block: IPBlock | None = Field(default=None, description="Addresses outside the cluster's pods.")

    @model_validator(mode="after")
    def _some_peer(self) -> NetworkPolicyPeer:
        if self.pod_selector is None and self.namespace_selector is None and self.ip_block is None:
            raise ValueError(str(_CEL_ONE_PEER_KIND["message"]))
        return self


class NetworkPolicySettings(_Model):
    """Who may reach the service's pods, and what its servers may reach: NetworkPolicies the operator keeps for them
    (a CNI that enforces NetworkPolicy is needed, elsewhere they change nothing)."""

    enabled: bool = Field(
        default=True,
        description="Keep the NetworkPolicies: the servers admit their router (router mode) or allowedFrom "
        "(otherwise), the router admits allowedFrom, and both admit metricsFrom on their metrics ports. false: "
        "none (every pod of the cluster may reach the servers and the router).",
    )
    allowed_from: list[NetworkPolicyPeer] | None = Field(
        default=None,
        max_length=16,
        description="Who may send requests to the service (as a NetworkPolicy's from peers). Default: every pod "
        "of the service's namespace. The CpuLLMGateways in front of it are admitted without being named; with "
        "routing inferencePool, include the Gateway's pods.",
    )
    metrics_from: list[NetworkPolicyPeer] = Field(
        default_factory=list,
        max_length=16,
        description="Who may scrape the servers' /metrics (on their API port, with the API key where set) and "
        "the router's metrics port, e.g. Prometheus' namespace. Default: only allowedFrom reaches /metrics.",
    )
    egress: bool = Field(
        default=True,
        description="Also limit what the servers reach: DNS (port 53), HTTPS (443) to addresses outside the private, "
        "shared, link-local and loopback ranges (the Hub and its CDN), and egressTo. Not the cluster's pods and "
        "Services, nor a node's or a cloud's metadata address. false: the servers reach anything.",
    )
    egress_to: list[NetworkPolicyPeer] = Field(
        default_factory=list,
        max_length=16,
        description="More the servers may reach, on any port (as a NetworkPolicy's to peers): a Hub mirror's "
        "addresses (HF_ENDPOINT), an in-cluster object store's pods.",
    )


class RoutingMode(StrEnum):
    AUTO = "auto"
    SERVICE = "service"
    ROUTER = "router"
    INFERENCE_POOL = "inferencePool"


class RouterAffinity(StrEnum):
    PREFIX = "prefix"
    NONE = "none"


class RouterSettings(_Model):
    image: str | None = Field(
        default=None,
        max_length=1024,
        pattern=IMAGE_REFERENCE_PATTERN,
        description="HAProxy image of the router (any with `haproxy` on its PATH; HAProxy 2.6 or newer). Unset: "
        "the operator's router image, its administrator's choice (the chart's router.image), as "
        "status.plan.routerImage shows.",
    )
    replicas: int = Field(default=1, ge=1, le=10, description="Router pods (each balances on its own).")
    cpu: str = Field(
        default="100m",
        pattern=r"^([0-9]{1,6}m|[0-9]{1,3}(\.[0-9]{1,3})?)$",
        max_length=16,
        description="CPU each router pod requests (not limited: a throttled proxy delays every token). Whole-node "
        "plans leave this room on every node, so the router never takes CPUs a server needs.",
    )
    memory: str = Field(
        default="128Mi",
        pattern=r"^[1-9][0-9]{0,11}(Ki|Mi|Gi|k|M|G)?$",
        max_length=16,
        description="Memory each router pod requests and is limited to.",
    )
    affinity: RouterAffinity = Field(
        default=RouterAffinity.NONE,
        description="none: the server with the fewest requests in flight. prefix: a conversation's requests go to "
        "the server that served its last one, where vLLM's prefix cache holds its earlier turns (keyed on "
        "sessionHeader, else the first user message, else the prompt's first 256 bytes), unless that server is "
        "over loadFactor; a new one to the least busy (docs/routing.md).",
    )
    session_header: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$",
        description="A request header that names the conversation (for example x-session-id), for clients that "
        "send one: its value is the affinity key. Unset: the request's own text.",
    )
    load_factor: int = Field(
        default=150,
        ge=101,
        le=1000,
        description="With prefix affinity, the most a server holds for its conversations, in percent of the "
        "requests it runs at once (maxNumSeqs; 150: half as many again may wait for it), before one moves.",
    )
    cluster_domain: str = Field(
        default="cluster.local",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        max_length=253,
        description="The cluster's DNS domain: the router finds the servers by resolving their headless Service.",
    )


class InferencePoolRouting(_Model):
    endpoint_picker: str = Field(
        min_length=1,
        max_length=253,
        description="The Service of the endpoint picker (EPP) that scores the pool's pods, in the service's "
        "namespace (deployed with the Gateway API Inference Extension; the operator does not run one).",
    )
    endpoint_picker_port: int = Field(default=9002, ge=1, le=65535, description="The endpoint picker's gRPC port.")
    gateway: str | None = Field(
        default=None,
        max_length=253,
        description="A Gateway in the service's namespace: an HTTPRoute sending its traffic to the pool is "
        "created. Unset: no HTTPRoute.",
    )


_CEL_POOL_SETTINGS: dict[str, JsonValue] = {
    "rule": "self.mode != 'inferencePool' || has(self.inferencePool)",
    "message": "mode inferencePool needs inferencePool.endpointPicker",
}


class Routing(_Model):
    """How requests reach the servers, and how a server leaves without cutting the requests it holds."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_CEL_POOL_SETTINGS]})

    mode: RoutingMode = Field(
        default=RoutingMode.AUTO,
        description="service: the Service selects the servers. router: an HAProxy router sends each request to "
        "the server with the fewest in flight, or the one that served its conversation (router.affinity). "
        "inferencePool: an InferencePool selects them for a Gateway's "
        "endpoint picker. auto: router for throughput placement of more than one server, else service "
        "(docs/routing.md).",
    )
    router: RouterSettings = Field(default_factory=RouterSettings, description="The router (mode router).")
    inference_pool: InferencePoolRouting | None = Field(
        default=None, description="The InferencePool (mode inferencePool)."
    )
    drain_seconds: int | None = Field(
        default=None,
        ge=0,
        le=86400,
        description="The longest a request may run: a stopping server gets this long to finish what it holds "
        "(after it left the endpoints), and the router waits this long for a response. Default: derived from "
        "the context length and the weights each token streams (status.plan.drainSeconds).",
    )

    @model_validator(mode="after")
    def _pool_settings(self) -> Routing:
        if self.mode == RoutingMode.INFERENCE_POOL and self.inference_pool is None:
            raise ValueError(str(_CEL_POOL_SETTINGS["message"]))
        return self


# What KEDA's operator may be pointed at: http(s), a host (DNS name or IPv4), an optional port and path; no
# userinfo, query or fragment; and not a loopback (127.0.0.0/8, localhost) or link-local (169.254.0.0/16, where
# clouds serve instance metadata) host. KEDA queries it from its own pod: a tenant must not aim that pod at itself.
PROMETHEUS_ADDRESS_PATTERN = r"^https?://[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?(/[-A-Za-z0-9._~/]*)?$"
PROMETHEUS_FORBIDDEN_HOSTS = r"^https?://(localhost([:/.]|$)|127[.]|169[.]254[.]|0[.])"  # no escapes: a CEL string too
_CEL_PROMETHEUS_HOST: dict[str, JsonValue] = {
    "rule": f"!has(self.prometheusAddress) || !self.prometheusAddress.matches('{PROMETHEUS_FORBIDDEN_HOSTS}')",
    "message": "prometheusAddress must not name a loopback or link-local host (KEDA's own pod would query it)",
}


class AutoscalerKind(StrEnum):
    HPA = "hpa"
    KEDA = "keda"


class Autoscaling(_Model):
    """Scales the CpuLLMService's own scale subresource on vLLM's queue, so the operator stays the one writer of
    the Deployment and the plan caps what can be placed."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self.minReplicas <= self.maxReplicas", "message": "minReplicas must not exceed maxReplicas"},
                {
                    "rule": "self.minReplicas > 0 || self.kind == 'keda'",
                    "message": "scaling to zero (minReplicas 0) needs kind keda",
                },
                {
                    "rule": "self.kind != 'keda' || has(self.prometheusAddress)",
                    "message": "kind keda needs prometheusAddress (KEDA's Prometheus trigger queries it)",
                },
                _CEL_PROMETHEUS_HOST,
            ]
        }
    )

    kind: AutoscalerKind = Field(
        default=AutoscalerKind.HPA,
        description="hpa: a HorizontalPodAutoscaler (autoscaling/v2) on the Pods metric vllm_num_requests_waiting "
        "(served by a custom metrics adapter, e.g. prometheus-adapter). keda: a KEDA ScaledObject with a "
        "Prometheus trigger on vllm:num_requests_waiting.",
    )
    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="0 (kind keda only) scales to zero when idle: the next request then waits for a cold start "
        "(minutes on CPU: image, model load, compilation).",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Upper bound; the plan may place fewer (status.plan).")
    target_waiting_requests: int = Field(
        default=2, ge=1, description="Requests waiting in vLLM's queue per replica that the autoscaler aims for."
    )
    max_kv_cache_usage: float | None = Field(
        default=None,
        ge=0.01,
        le=1,
        description="Optional guard: also scale up when vLLM's KV cache usage (0-1) averages above this.",
    )
    scale_down_stabilization_seconds: int = Field(
        default=900,
        ge=0,
        le=3600,  # the HPA's own bound
        description="How long the wanted replica count must stay lower before scaling down: CPU servers take "
        "minutes to start, so scale down slowly.",
    )
    prometheus_address: str | None = Field(
        default=None,
        max_length=2048,
        pattern=PROMETHEUS_ADDRESS_PATTERN,
        description="Prometheus URL for KEDA's trigger, e.g. http://prometheus.monitoring:9090: http or https, a "
        "host name or address and an optional port and path; no credentials, query or fragment, and no "
        "loopback or link-local host (KEDA's own pod queries it: not a cloud's metadata service, not itself).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Autoscaling:
        """The CEL rules above, again for the CLI (the API server runs them at admission)."""
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must not exceed maxReplicas")
        if self.min_replicas == 0 and self.kind != AutoscalerKind.KEDA:
            raise ValueError("scaling to zero (minReplicas 0) needs kind keda")
        if self.kind == AutoscalerKind.KEDA and self.prometheus_address is None:
            raise ValueError("kind keda needs prometheusAddress (KEDA's Prometheus trigger queries it)")
        if self.prometheus_address is not None and re.match(PROMETHEUS_FORBIDDEN_HOSTS, self.prometheus_address):
            raise ValueError(str(_CEL_PROMETHEUS_HOST["message"]))
        return self


# The env a server gets with a speculative method on, by method. vLLM's n-gram proposer (v1/spec_decode/
# ngram_proposer.py, read in 0.32.0) runs a numba parallel loop; where the image has no TBB, numba starts its OpenMP
# layer, whose start sets the OpenMP thread count of the calling thread to numba's and turns nested regions on, in
# the Intel OpenMP runtime torch shares (the x86 image preloads it): torch's matrices then ran on one thread of two
# and a 1.5B model decoded at half speed (docs/speculative.md). Numba's own thread pool leaves torch's threads alone.
SPECULATIVE_ENV: dict[str, dict[str, str]] = {SpeculativeMethod.NGRAM.value: {"NUMBA_THREADING_LAYER": "workqueue"}}

# What the operator renders itself, each with the spec field that sets it: a spec.env entry or spec.extraArgs flag
# of these names would silently override the plan (the KV size, the binding, the port the probes call, ...).
OWNED_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "kvCacheGiB",
    "VLLM_CPU_OMP_THREADS_BIND": "cpu.threadsBind",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "cpu.reservedCpusPerRank",
    "OMP_NUM_THREADS": "cpu.threadsBind",
    "CPU_VISIBLE_MEMORY_NODES": "cpu.launcher",
    "LD_PRELOAD": "image",
    "HF_HOME": "modelCache",
    "VLLM_CACHE_ROOT": "modelCache",
    "VLLM_USE_AOT_COMPILE": "modelCache",
    "TORCHINDUCTOR_CACHE_DIR": "modelCache",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "cpu.cpusPerRank",
    **{name: "speculative" for env in SPECULATIVE_ENV.values() for name in env},
    "HF_TOKEN": "hfTokenSecret",
    "VLLM_API_KEY": "apiKeySecret",
    REPORT_ENV: "cpu.launcher",
    GUARD_METRICS_ENV: "apiKeySecret.metrics",
}
OWNED_FLAGS = {
    "--model": "model.name",
    "--revision": "model.revision",
    "--dtype": "model.dtype",
    "--tensor-parallel-size": "tensorParallelSize",
    "-tp": "tensorParallelSize",
    "--distributed-executor-backend": "tensorParallelSize",
    "--max-model-len": "maxModelLen",
    "--max-num-seqs": "maxNumSeqs",
    "--kv-cache-dtype": "kvCacheDtype",
    "--host": "service",
    "--port": "service.port",
    "--api-key": "apiKeySecret",
    "--speculative-config": "speculative",
    "-sc": "speculative",
    "--enable-lora": "adapters",
    "--lora-modules": "adapters",
    "--max-loras": "adapters",
    "--max-lora-rank": "adapters",
    "--max-cpu-loras": "adapters",
}
# What spec.env and spec.extraArgs may not set at all, with why: each opens a way around the plan or the API key.
REFUSED_ENV = {
    "HUGGING_FACE_HUB_TOKEN": "a token in the Deployment's text: set spec.hfTokenSecret",
    "VLLM_SERVER_DEV_MODE": "adds development routes the API key does not guard",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "loads adapters on request, in memory the plan does not count: list them "
    "in spec.adapters",
}
REFUSED_FLAGS = {
    "--config": "a file of flags the operator cannot check: give each flag in extraArgs",
    "--hf-token": "a token in the Deployment's text: set spec.hfTokenSecret",
}


# Every flag spec.extraArgs may not set, in one order: the operator's check and the API server's rule read it.
CHECKED_FLAGS = tuple(sorted(OWNED_FLAGS.keys() | REFUSED_FLAGS.keys()))


def flag_name(arg: str) -> str:
    """An argument's flag as vLLM's parser reads it: '--max_model_len=8' is --max-model-len (vLLM turns '_' in a
    flag into '-'), and '--api-key.x=1' is --api-key (vLLM 0.32's FlexibleArgumentParser makes a dotted flag a
    JSON value of the flag before the first '.')."""
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def flag_meant(arg: str) -> str | None:
    """The owned or refused flag an argument sets, if any. vLLM's parser (argparse, allow_abbrev on in 0.32) also
    takes a long flag's unambiguous prefix for it ('--max-model 9' sets --max-model-len), and a short flag's value
    attached ('-tp2'): a prefix of one is taken for it. No vLLM flag is a prefix of one the operator owns."""
    flag = flag_name(arg)
    if flag in OWNED_FLAGS or flag in REFUSED_FLAGS:
        return flag
    if flag.startswith("--") and len(flag) > 2:
        return next((name for name in CHECKED_FLAGS if name.startswith(flag)), None)
    return next((name for name in CHECKED_FLAGS if not name.startswith("--") and flag.startswith(name)), None)


def owned_collisions(env_names: list[str], args: list[str]) -> list[str]:
    """The spec.env names and spec.extraArgs flags the operator sets itself, each with the field to use instead,
    and those refused outright, each with why."""
    found = [f"env {name} (set spec.{OWNED_ENV[name]})" for name in env_names if name in OWNED_ENV]
    found += [f"env {name} ({REFUSED_ENV[name]})" for name in env_names if name in REFUSED_ENV]
    for arg in args:
        flag = flag_meant(arg)
        written = "" if flag is None or flag_name(arg) == flag else f" as {flag_name(arg)}"
        if flag in OWNED_FLAGS:
            found.append(f"extraArgs {flag}{written} (set spec.{OWNED_FLAGS[flag]})")
        elif flag in REFUSED_FLAGS:
            found.append(f"extraArgs {flag}{written} ({REFUSED_FLAGS[flag]})")
    return found


def _cel_list(items: list[str]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


_CEL_OWNED_ENV: dict[str, JsonValue] = {
    "rule": f"!has(self.env) || self.env.all(e, !(e.name in {_cel_list(sorted(OWNED_ENV | REFUSED_ENV))}))",
    "message": "env sets a variable the operator owns or refuses: "
    + ", ".join(f"{name} (use spec.{field})" for name, field in sorted(OWNED_ENV.items()))
    + ", "
    + ", ".join(f"{name} ({why})" for name, why in sorted(REFUSED_ENV.items())),
}


def _flags_pattern(flags: Sequence[str]) -> str:
    """An RE2 pattern matching an argument that is one of `flags`, alone or with '=value', '_' taken for '-' past
    the leading dashes (as vLLM reads it): one match per argument keeps the rule within the API server's CEL
    cost budget, where a replace and a comparison per flag and argument did not. Abbreviations (flag_meant) are
    left to the operator's check, a condition on the service: all their spellings would not fit the budget."""
    spelled = [flag[:2] + flag[2:].replace("-", "[-_]") if flag.startswith("--") else flag for flag in flags]
    return "^(" + "|".join(spelled) + ")([=.]|$)"


_CEL_OWNED_FLAGS: dict[str, JsonValue] = {
    "rule": "!has(self.extraArgs) || self.extraArgs.all(a, !a.matches('" + _flags_pattern(CHECKED_FLAGS) + "'))",
    "message": "extraArgs sets a flag the operator owns or refuses ('_' counts as '-', '--flag.key' sets --flag): "
    + ", ".join(f"{flag} (use spec.{field})" for flag, field in sorted(OWNED_FLAGS.items()))
    + ", "
    + ", ".join(f"{flag} ({why})" for flag, why in sorted(REFUSED_FLAGS.items())),
}
# With apiKeySecret the operator puts the key guard's directory first on PYTHONPATH and the user's PYTHONPATH after it,
# in one variable (core/children/deployment.py): a PYTHONPATH from valueFrom has no text to join, and would be lost.
_CEL_ADAPTER_NOT_THE_MODEL: dict[str, JsonValue] = {
    "rule": "!has(self.adapters) || self.adapters.all(a, a.name != self.model.name)",
    "message": "an adapter's name is the model name requests use for it: it cannot be the base model's name "
    "(spec.model.name)",
}
_CEL_PYTHONPATH_WITH_KEY: dict[str, JsonValue] = {
    "rule": "!has(self.apiKeySecret) || !has(self.env) || self.env.all(e, e.name != 'PYTHONPATH' || has(e.value))",
    "message": "with apiKeySecret, env PYTHONPATH must be a value, not valueFrom: the operator joins it after the "
    "API key guard's directory",
}


class CpuLLMServiceSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _CEL_OWNED_ENV,
                _CEL_OWNED_FLAGS,
                _CEL_PYTHONPATH_WITH_KEY,
                _CEL_ADAPTER_NOT_THE_MODEL,
            ]
        }
    )

    model: ModelSource = Field(description="The model to serve, and where its config comes from.")
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Number of vLLM pods (scale subresource). With throughput placement, capped to the NUMA "
        "nodes of the chosen nodes (status.plan.replicas says how many were planned).",
    )
    objective: Objective = Field(
        default=Objective.THROUGHPUT,
        description="What the plan's predicted speed is chosen for, among the node shapes (and, with placement "
        "auto, between one TP server per node and a server per NUMA node): throughput, the most generated tokens "
        "per second per CPU at maxNumSeqs; latency, the fastest single sequence (docs/performance.md).",
    )
    placement: Placement = Field(
        default=Placement.TENSOR_PARALLEL,
        description="tensorParallel: one pod per node, one rank per NUMA node (large models). throughput: one "
        "TP=1 server per NUMA node, each pod sized to one NUMA node (models that fit one; more requests "
        "served); exact where nodes are labelled cpullm.io/topology-manager-policy=single-numa-node or "
        "restricted, best-effort elsewhere. auto: throughput when one TP=1 server fits one NUMA node's memory, "
        "else tensorParallel.",
    )
    image: str | None = Field(
        default=None,
        max_length=1024,
        pattern=IMAGE_REFERENCE_PATTERN,
        description="vLLM CPU image. Unset: the operator's image for the chosen nodes' arch, its administrator's "
        "choice (the chart's vllm.images), else the pinned vllm/vllm-openai-cpu image, as status.plan.image shows.",
    )
    tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Ranks per pod. Default: one per NUMA node of the chosen nodes, capped to what vLLM "
        "supports (divides the attention and KV heads, never 6) and to memory.",
    )
    vllm_version: str | None = Field(
        default=None,
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$",
        description="The vLLM version spec.image runs, where its tag does not say (a digest, a tag of your own): which "
        "of the launcher's fixes apply, and what the plan counts for them, follow it. Unset: read from the image's "
        "tag; a version it cannot tell gets the plan that counts on no fix.",
    )
    kv_cache_gi_b: int | None = Field(
        default=None,
        alias="kvCacheGiB",
        ge=1,
        description="KV cache per rank in whole GiB (VLLM_CPU_KVCACHE_SPACE). Default: derived from "
        "maxModelLen x maxNumSeqs, each defaulting (when kvCacheGiB is unset) to the model's context capped at "
        "8192 tokens and 8 sequences; the plan shows what was chosen.",
    )
    kv_cache_dtype: KVCacheDType = Field(
        default=KVCacheDType.AUTO,
        description="KV cache element type (vLLM's --kv-cache-dtype). auto: the model's dtype. fp8: one byte per "
        "element, half the KV memory of bfloat16; vLLM CPU runs it on x86 nodes with AVX-512 (or AMX) and not for "
        "MLA models (DeepSeek), so it narrows the eligible nodes.",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="Context length (--max-model-len), at most the model's own (its config's "
        "max_position_embeddings). Unset with an explicit kvCacheGiB: the model's own, or the longest the KV "
        "cache holds (in vLLM's 128-token blocks) when that is shorter; unset without one: the model's own, at "
        "most 8192.",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        description="Concurrent sequences (--max-num-seqs). Unset without kvCacheGiB: 8; unset with it: vLLM's own.",
    )
    cpu: CpuSettings = Field(
        default_factory=CpuSettings, description="CPUs per rank, thread binding and the ISA the nodes must have."
    )
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=64, description="Labels every chosen node must have (as a pod's)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Taints the pods tolerate (as a pod's)."
    )
    affinity: Affinity | None = Field(
        default=None,
        description="Pod affinity as in a pod spec. Its required node affinity also narrows the eligible "
        "nodes; the operator adds the nodes it chose.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra container env. The variables the operator sets (VLLM_CPU_KVCACHE_SPACE, "
        "VLLM_CPU_OMP_THREADS_BIND, LD_PRELOAD, HF_TOKEN, ...) are refused: set the spec field that owns them.",
    )
    extra_args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=64,  # with 4,096 characters each, what the API server's CEL cost budget lets the rule check
        description="Extra `vllm serve` arguments, appended. The flags the operator sets (--model, --port, "
        "--tensor-parallel-size, --max-model-len, ...) are refused: set the spec field that owns them.",
    )
    hf_token_secret: SecretKeyRef | None = Field(
        default=None, description="Secret with a Hugging Face token, for gated models (pod and operator)."
    )
    api_key_secret: ApiKeySecretRef | None = Field(
        default=None,
        description="Secret holding an API key that every request to the servers needs ('Authorization: Bearer "
        "<key>'), on every path but /health and /metrics (open for probes and scraping). vLLM's own check "
        "(VLLM_API_KEY) covers only /v1 and a few other prefixes; the operator adds a guard for the rest through "
        "vLLM's --middleware. Read by the pod only, never by the operator.",
    )
    model_cache: ModelCache | None = Field(
        default=None,
        description="Volume for downloaded weights, mounted at /models. Default: an emptyDir limited to twice "
        "the model's weights and 2 GiB. An emptyDir's sizeLimit is also the pod's ephemeral-storage request.",
    )
    service: ServiceSettings = Field(
        default_factory=ServiceSettings, description="The Service in front of the vLLM pods."
    )
    adapters: list[Adapter] | None = Field(
        default=None,
        max_length=MAX_ADAPTERS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="LoRA adapters served beside the model, each under its own name (vLLM's --lora-modules). The "
        "plan counts their memory; LoRA turns vLLM's compilation off on CPU, which the prediction counts too.",
    )
    speculative: Speculative = Field(
        default_factory=Speculative,
        description="Speculative decoding (vLLM's --speculative-config), chosen by the plan's prediction by default.",
    )
    routing: Routing = Field(
        default_factory=Routing, description="How requests reach the servers, and how servers drain."
    )
    monitoring: Monitoring = Field(default_factory=Monitoring, description="Prometheus scraping of the vLLM pods.")
    network_policy: NetworkPolicySettings = Field(
        default_factory=NetworkPolicySettings, description="Who may reach the servers and the router."
    )
    autoscaling: Autoscaling | None = Field(
        default=None, description="Scale on vLLM's queue with an HPA or a KEDA ScaledObject. Unset: no autoscaler."
    )
    numa_privileges: bool = Field(
        default=True,
        description="Add the SYS_NICE capability (every other one is dropped), which vLLM's NUMA memory binding "
        "needs: the container runtime's default seccomp profile allows get_mempolicy, set_mempolicy and mbind "
        "only to a process that has it. Pod Security baseline and restricted reject SYS_NICE: set false there, "
        "and vLLM runs without NUMA memory binding.",
    )
    seccomp_profile: SeccompProfile = Field(
        default=SeccompProfile.RUNTIME_DEFAULT,
        description="The vLLM container's seccomp profile. RuntimeDefault (the container runtime's profile) is "
        "enough for vLLM's NUMA calls with SYS_NICE; Unconfined lifts every syscall filter (what vLLM's own "
        "Kubernetes recipe sets), for a kernel or runtime whose default profile blocks a call vLLM needs.",
    )

    @property
    def metrics_need_key(self) -> bool:
        """Whether the servers' /metrics need the API key (spec.apiKeySecret.metrics: key)."""
        return self.api_key_secret is not None and self.api_key_secret.metrics == MetricsAccess.KEY

    @property
    def most_replicas(self) -> int:
        """The most servers the service may run: its replicas, or what its autoscaler may scale it to."""
        return max(self.replicas, self.autoscaling.max_replicas if self.autoscaling else 0)

    @model_validator(mode="after")
    def _nothing_the_operator_owns(self) -> CpuLLMServiceSpec:
        """The CEL rules on env and extraArgs, again for the CLI and for objects stored before them."""
        collisions = owned_collisions([e.name for e in self.env], self.extra_args)
        if collisions:
            raise ValueError("sets what the operator owns or refuses: " + "; ".join(collisions))
        if self.api_key_secret is not None and any(e.name == "PYTHONPATH" and e.value is None for e in self.env):
            raise ValueError(str(_CEL_PYTHONPATH_WITH_KEY["message"]))
        names = [a.name for a in self.adapters or []]
        if self.model.name in names:
            raise ValueError(str(_CEL_ADAPTER_NOT_THE_MODEL["message"]))
        if len(set(names)) < len(names):
            raise ValueError("adapters: two adapters have the same name")
        return self


# The deepest nesting a spec may have: a real config.json or affinity is under 10 levels deep; the API server
# stores far deeper ones in free-form fields, which would exhaust the recursion of whatever walks them.
MAX_SPEC_DEPTH = 64


def too_deep(value: Any, limit: int = MAX_SPEC_DEPTH) -> bool:
    """Is `value` nested more than `limit` levels deep? Walked without recursion, so any depth is answered."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, Mapping) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, Mapping | list))
    return False


def copy_json(value: Any) -> Any:
    """A deep copy of JSON data (mappings, lists, scalars) as dicts and lists, made without recursion: a stored
    spec may be nested deeper than copy.deepcopy's recursion reaches, and it must still reach parse_spec to be
    refused there."""
    if not isinstance(value, Mapping | list):
        return value
    root: Any = {} if isinstance(value, Mapping) else []
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        source, target = stack.pop()
        items = source.items() if isinstance(source, Mapping) else enumerate(source)
        for key, item in items:
            copied = {} if isinstance(item, Mapping) else [] if isinstance(item, list) else item
            if isinstance(target, dict):
                target[key] = copied
            else:
                target.append(copied)
            if copied is not item:
                stack.append((item, copied))
    return root


def parse_spec(raw: Mapping[str, Any] | None) -> CpuLLMServiceSpec:
    """Validate a spec as the API server stored it; errors become one InvalidSpec naming each field."""
    return parse_model(CpuLLMServiceSpec, raw)


def parse_model(model: type[M], raw: Mapping[str, Any] | None) -> M:
    """Validate the spec of one of our kinds (`model`, its spec model); errors become one InvalidSpec naming each
    field, nothing of a field's value but its type."""
    if too_deep(raw):
        raise InvalidSpec(f"spec: nested more than {MAX_SPEC_DEPTH} levels deep (no field of a spec needs that)")
    try:
        return model.model_validate(raw or {})
    except ValidationError as err:
        raise InvalidSpec("; ".join(_problem(e, model) for e in err.errors())) from err


def _problem(error: Any, spec: type[BaseModel]) -> str:
    """One validation error as a person reads it: the field's path, and for a field the spec does not have, the
    closest one it does (a misspelling the API server would have pruned silently)."""
    where = "spec." + ".".join(str(p) for p in error["loc"]) if error["loc"] else "spec"
    if error["type"] == "extra_forbidden" and error["loc"]:
        guess = difflib.get_close_matches(str(error["loc"][-1]), _field_names(spec), n=1, cutoff=0.7)
        return f"{where}: no such field" + (f" (did you mean {guess[0]}?)" if guess else "")
    if error["type"] == "model_type":  # pydantic names its class ("a valid dictionary or instance of SecretKeyRef")
        model = vars(sys.modules[spec.__module__]).get((error.get("ctx") or {}).get("class_name", ""))
        fields: list[str] = []
        if isinstance(model, type) and issubclass(model, BaseModel):
            fields = [f.alias or name for name, f in model.model_fields.items()]
        with_fields = f" with {', '.join(fields)}" if fields and len(fields) <= 6 else ""
        return f"{where}: should be an object{with_fields}, not {type(error.get('input')).__name__}"
    return f"{where}: {error['msg']}"


@functools.cache
def _field_names(spec: type[BaseModel]) -> tuple[str, ...]:
    """Every field name (as spelt in YAML) anywhere in the spec."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties", {}))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec.model_json_schema(by_alias=True))
    return tuple(sorted(names))
