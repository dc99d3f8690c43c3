"""Fuzzed input: a bad model config, spec or node never crashes the operator. Each becomes a typed error
(cpullm.errors) with a message a person can act on, reported as a condition.

The property tests are deterministic (derandomize, no example database), so a run tests the same inputs
every time; each crash they found is pinned as a row of the regression tables below.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec, DType, parse_spec
from cpullm.controller.gather import gather
from cpullm.core import topology as t
from cpullm.core.decision import decide
from cpullm.core.observation import ClusterView, NamespaceFacts
from cpullm.core.planner import plan_service
from cpullm.core.sizing import FAMILIES, ModelFiles, ModelSize, anatomy_of, size_model
from cpullm.errors import InvalidSpec, NodeLabelError, PlanRefusal, UnsupportedModel
from cpullm.io.files import load_nodes

from .builders import LLAMA_8B, MISTRAL_7B_V03, QWEN3_06B, QWEN25_05B, node_object, spec

ROOT = Path(__file__).resolve().parents[2]


def _no_warning(message: str) -> None:
    raise AssertionError(f"examples/nodes.yaml has a bad node: {message}")


NODES = tuple(load_nodes(str(ROOT / "examples" / "nodes.yaml"), _no_warning))
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def fuzz(max_examples: int) -> Callable[[Any], Any]:
    return settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=max_examples,
        suppress_health_check=[HealthCheck.too_slow],
    )


# Garbage of every JSON/YAML kind, with the boundaries sizes care about (0, negatives, huge).
JUNK = st.one_of(
    st.integers(-3, 3),
    st.integers(-(10**20), 10**20),
    st.sampled_from([10**18, 10**20, 2**63, -(2**63), 10**400, 10**5000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.none(),
    st.booleans(),
    st.lists(st.integers(0, 8), max_size=2),
)

# ---------------------------------------------------------------------------------------------------------------
# Model configs
# ---------------------------------------------------------------------------------------------------------------

_KEEP, _MISSING = "keep", "missing"
# Plausible sizes too, so that many fuzzed configs get past sizing into the planner.
_SIZES = st.one_of(st.integers(1, 4096), JUNK)
_CONFIG_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model_type": st.one_of(st.sampled_from([*sorted(FAMILIES), "gemma3", "", "LLAMA"]), JUNK),
    "hidden_size": _SIZES,
    "intermediate_size": _SIZES,
    "num_hidden_layers": _SIZES,
    "num_attention_heads": _SIZES,
    "num_key_value_heads": _SIZES,
    "head_dim": _SIZES,
    "vocab_size": _SIZES,
    "max_position_embeddings": _SIZES,
    "tie_word_embeddings": st.one_of(st.booleans(), JUNK),
    "torch_dtype": st.one_of(st.sampled_from(["bfloat16", "float16", "float32", "int8", ""]), JUNK),
}


@st.composite
def broken_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A real config with some fields missing and some replaced by garbage."""
    config = dict(draw(st.sampled_from([LLAMA_8B, QWEN25_05B, QWEN3_06B, MISTRAL_7B_V03])))
    for key, values in _CONFIG_FIELDS.items():
        what = draw(st.sampled_from([_KEEP] * 8 + [_MISSING, "value"]))
        if what == _MISSING:
            config.pop(key, None)
        elif what == "value":
            config[key] = draw(values)
    return config


# Configs whose every field is well typed but whose sizes are odd (tiny, mismatched, at the bounds), so that the
# sizing arithmetic and the planner meet shapes no real model has.
_ODD = st.one_of(st.integers(1, 64), st.sampled_from([1, 2, 3, 7, 4096, 2**14, 2**20, 2**24, 2**30]))
odd_configs = st.fixed_dictionaries(
    {
        "model_type": st.sampled_from(["llama", "mistral", "qwen2", "qwen3", "granite", "phi3"]),
        "hidden_size": _ODD,
        "intermediate_size": _ODD,
        "num_hidden_layers": _ODD,
        "num_attention_heads": _ODD,
        "vocab_size": _ODD,
    },
    optional={
        "num_key_value_heads": _ODD,
        "head_dim": _ODD,
        "max_position_embeddings": _ODD,
        "tie_word_embeddings": st.booleans(),
        "attention_bias": st.booleans(),
    },
)
model_configs = st.one_of(broken_configs(), odd_configs)


# Valid specs that take the planner down each road: TP, throughput, auto, a derived KV cache, the model's context.
PLANNING_SPECS = (
    spec(),
    spec(placement="throughput", replicas=3),
    spec(placement="auto", kvCacheGiB=None, maxNumSeqs=4),
    spec(tensorParallelSize=2, maxModelLen=None),
)


def _check_size(size: ModelSize) -> None:
    assert size.weights_bytes >= 1
    assert size.parameters is None or size.parameters >= 1
    for part in (size.num_layers, size.num_attention_heads, size.dtype_bytes):
        assert type(part) is int and part >= 1
    for group in size.anatomy.kv_groups:
        assert group.layers >= 1 and group.kv_heads >= 1 and group.entry >= 1
    assert size.kv_bytes_per_token >= 1
    assert size.max_position_embeddings is None or size.max_position_embeddings >= 1


def _plan_or_refuse(service: CpuLLMServiceSpec, size: ModelSize) -> None:
    try:
        plan = plan_service(service, size, NODES)
    except PlanRefusal as refusal:
        assert refusal.message
        event(f"refused: {refusal.reason}")
        return
    event("planned")
    assert isinstance(plan, Plan)
    assert plan.memory_limit_bytes >= 1 and plan.kv_tokens_per_rank >= 0
    # Planned again as the operator does once the servers run (status.plan as `current`), on the same nodes: the
    # same plan, so the status a user reads matches `cpullm plan` and nothing rolls.
    assert plan_service(service, size, NODES, plan.model_dump(by_alias=True, mode="json")) == plan


@fuzz(max_examples=150)
@given(config=model_configs, dtype=st.sampled_from(list(DType)))
def test_fuzzed_model_config_is_sized_or_unsupported_and_then_planned_or_refused(config, dtype):
    try:
        size = size_model(config, dtype)
    except UnsupportedModel as err:
        assert err.message.startswith(("model config", "model_type"))
        event("unsupported model")
        return
    _check_size(size)
    parameters = anatomy_of(config).parameters
    assert type(parameters) is int and parameters >= 1
    assert size.weights_bytes == parameters * size.dtype_bytes
    for service in PLANNING_SPECS:
        _plan_or_refuse(service, size)


@fuzz(max_examples=60)
@given(
    config=model_configs,
    checkpoint=st.one_of(st.integers(-5, 5), st.integers(-(10**20), 10**20), st.booleans()),
)
def test_fuzzed_checkpoint_size_is_used_or_refused(config, checkpoint):
    """The safetensors index's total_size comes from the Hub: a bad one is an UnsupportedModel too."""
    try:
        size = size_model(config, DType.BFLOAT16, checkpoint_total_bytes=checkpoint)
    except UnsupportedModel as err:
        assert err.message.startswith(("model config", "model.safetensors.index.json"))
        return
    _check_size(size)
    _plan_or_refuse(PLANNING_SPECS[0], size)


# ---------------------------------------------------------------------------------------------------------------
# Whole specs, through gather and decide as the operator runs them
# ---------------------------------------------------------------------------------------------------------------

BASE_SPEC: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct", "dtype": "bfloat16", "config": dict(QWEN3_06B)},
    "replicas": 2,
    "placement": "auto",
    "kvCacheGiB": 4,
    "maxModelLen": 16384,
    "maxNumSeqs": 8,
    "cpu": {"requiredISA": ["avx512f"], "threadsBind": "auto", "launcher": True, "reservedCpusPerRank": 1},
    "nodeSelector": {"kubernetes.io/arch": "amd64"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
                ]
            }
        }
    },
    "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}],
    "extraArgs": ["--enable-prefix-caching"],
    "hfTokenSecret": {"name": "hf", "key": "HF_TOKEN"},
    "modelCache": {"emptyDir": {"sizeLimit": "50Gi"}},
    "service": {"port": 8000, "type": "ClusterIP"},
    "monitoring": {"podMonitor": True, "interval": "30s"},
    "autoscaling": {"kind": "hpa", "minReplicas": 1, "maxReplicas": 4, "maxKvCacheUsage": 0.8},
    "numaPrivileges": True,
}

JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 3),
        st.integers(-(10**30), 10**30),
        st.sampled_from([2**63 - 1, 2**63, 10**400]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
        st.sampled_from(["auto", "nobind", "0-3|4-7", "keda", "hpa", "Exists", "In", "64Gi", "float32"]),
        # Shapes the API server stores that once crashed or were taken silently: affinity operators and their
        # values, what the operator owns in env and args, the seccomp and KV cache choices.
        st.sampled_from(["Gt", "Lt", "NotIn", "DoesNotExist", "many", "-1", "99999999999999999999"]),
        st.sampled_from(["VLLM_CPU_KVCACHE_SPACE", "LD_PRELOAD", "HF_TOKEN", "--port=1", "-tp", "--model"]),
        st.sampled_from(["RuntimeDefault", "Unconfined", "fp8", "qwen.small"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)

Path_ = tuple[str | int, ...]


def _paths(value: Any, here: Path_ = ()) -> list[Path_]:
    """Every place in a JSON document (except the root), parents before children."""
    found: list[Path_] = []
    items: list[tuple[str | int, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    for key, child in items:
        found.append((*here, key))
        found.extend(_paths(child, (*here, key)))
    return found


def _container(document: Any, path: Path_) -> Any:
    for key in path[:-1]:
        document = document[key]
    return document


@st.composite
def fuzzed_specs(draw: st.DrawFn) -> dict[str, Any]:
    """BASE_SPEC with a few places replaced by random JSON (nested too), removed, or given unknown siblings."""
    document = copy.deepcopy(BASE_SPEC)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(document)))
        parent, key = _container(document, path), path[-1]
        what = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if what == "replace":
            parent[key] = draw(JSON)
        elif what == "remove":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=6))] = draw(JSON)
        else:
            parent.append(draw(JSON))
    return document


class _Cluster:
    def read_namespace(self, namespace: str) -> NamespaceFacts:
        return NamespaceFacts()

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        return "hf_token" if key == "HF_TOKEN" else None


class _Hub:
    def fetch(self, name: str, revision: str | None, token: str | None) -> ModelFiles:
        return ModelFiles(config=dict(LLAMA_8B), checkpoint_total_bytes=None)


def _decide(raw_spec: Any, name: str = "fuzz") -> Mapping[str, Any]:
    service = {"metadata": {"name": name, "namespace": "default", "uid": "u-1", "generation": 3}, "spec": raw_spec}
    observed = gather(service, ClusterView(nodes=NODES), last_status=None, cluster=_Cluster(), models=_Hub())
    decision = decide(observed, NOW)
    conditions = {c["type"]: c for c in decision.status["conditions"]}
    assert {"Planned", "Ready"} <= set(conditions)
    for condition in conditions.values():
        assert condition["status"] in ("True", "False") and condition["reason"] and condition["message"]
    assert isinstance(decision.outcome, Plan) == (conditions["Planned"]["status"] == "True")
    return conditions


def test_base_spec_is_planned():
    assert isinstance(parse_spec(BASE_SPEC), CpuLLMServiceSpec)
    assert _decide(BASE_SPEC)["Planned"]["status"] == "True"


@fuzz(max_examples=120)
@given(raw=fuzzed_specs())
def test_fuzzed_spec_is_parsed_or_invalid_and_decided_without_raising(raw):
    try:
        parse_spec(raw)
    except InvalidSpec as err:
        assert err.message.startswith(("spec.", "spec: "))
    event(f"Planned: {_decide(raw)['Planned']['reason']}")


@fuzz(max_examples=60)
@given(name=st.one_of(st.text(max_size=70), st.sampled_from(["qwen.small", "q" * 64, "Qwen", "-a", "a-", "a"])))
def test_any_name_is_decided_without_raising_and_one_the_children_cannot_take_is_invalid(name):
    planned = _decide(BASE_SPEC, name)["Planned"]
    fits = re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) is not None and len(name) <= 63
    assert (planned["reason"] != "InvalidSpec") == fits, (name, planned)


@fuzz(max_examples=40)
@given(
    operator=st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
    values=st.one_of(st.none(), st.lists(st.one_of(st.text(max_size=4), st.integers(-5, 5).map(str)), max_size=3)),
)
def test_any_node_selector_requirement_is_decided_without_raising(operator, values):
    requirement: dict[str, Any] = {"key": "kubernetes.io/arch", "operator": operator}
    if values is not None:
        requirement["values"] = values
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [requirement]}]}}}  # fmt: skip
    event(f"Planned: {_decide({**BASE_SPEC, 'affinity': affinity})['Planned']['reason']}")


@fuzz(max_examples=25)
@given(raw=JSON)
def test_any_json_as_the_whole_spec_is_decided_without_raising(raw):
    try:
        parse_spec(raw)
    except InvalidSpec as err:
        assert err.message.startswith(("spec.", "spec: "))
    if isinstance(raw, dict) or not raw:  # the API server stores an object (or nothing) as a spec
        _decide(raw)


# ---------------------------------------------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------------------------------------------

LABEL_KEYS = (
    t.NUMA_NODES_LABEL,
    t.NFD_NUMA_COUNT,
    t.NFD_SMT,
    t.CPU_MANAGER_POLICY_LABEL,
    t.TOPOLOGY_MANAGER_POLICY_LABEL,
    t.ARCH_LABEL,
    t.NFD_CPUID_PREFIX + "AVX512F",
    t.NFD_CPUID_PREFIX + "AMXBF16",
    t.ISA_LABEL_PREFIX + "avx512f",
    t.ISA_LABEL_PREFIX + "amx_bf16",
    "kubernetes.io/hostname",
)
LABEL_VALUES = st.one_of(
    st.sampled_from(["true", "false", "TRUE", "1", "2", "64", "65", "0", "-1", " 2", "static", "none", "restricted"]),
    st.sampled_from(["single-numa-node", "best-effort", "amd64", "arm64", ""]),
    st.text(max_size=6),
    st.integers(-2, 100),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True),
)
LEGAL_QUANTITIES = ["15900m", "64Gi", "1e9", "2.5", "0", "+1k", "94", "500Gi", "1E3", "0.5Ki", "-0", " 64 ", "8e18"]
ILLEGAL_QUANTITIES = ["-1", "abc", "1Zi", "", "1e999999999", "1e400", "9" * 400, ".", "1..2", "1e", "NaN", "1 Gi"]
QUANTITIES = st.one_of(
    st.sampled_from(LEGAL_QUANTITIES + ILLEGAL_QUANTITIES),
    st.integers(-10, 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.text(max_size=6),
    st.booleans(),
)


@st.composite
def node_objects(draw: st.DrawFn) -> dict[str, Any]:
    obj = node_object(draw(st.sampled_from(["node-0", "n", ""])), numa=None)
    labels = obj["metadata"]["labels"]
    for key in draw(st.lists(st.sampled_from(LABEL_KEYS), max_size=4, unique=True)):
        labels[key] = draw(LABEL_VALUES)
    allocatable = obj["status"]["allocatable"]
    for key in ("cpu", "memory"):
        what = draw(st.sampled_from(["keep", "missing", "value"]))
        if what == "missing":
            del allocatable[key]
        elif what == "value":
            allocatable[key] = draw(QUANTITIES)
    return obj


@fuzz(max_examples=200)
@given(obj=node_objects())
def test_fuzzed_node_is_profiled_or_a_label_error_naming_it(obj):
    name = obj["metadata"]["name"]
    try:
        profile = t.parse_node(obj)
    except NodeLabelError as err:
        assert err.message.startswith(f"node {name}: ")
        assert "label " in err.message or "allocatable" in err.message
        event("label error")
        return
    event("profiled")
    assert type(profile.cpus) is int and profile.cpus >= 0
    assert type(profile.memory_bytes) is int and profile.memory_bytes >= 0
    assert 1 <= profile.numa_nodes <= t.MAX_NUMA_NODES
    assert all(isinstance(v, str) for v in profile.labels.values())


# ---------------------------------------------------------------------------------------------------------------
# Regressions: each crash found (by hand or by the properties above), with the typed error it is now
# ---------------------------------------------------------------------------------------------------------------

NO_KV_HEADS = {k: v for k, v in QWEN25_05B.items() if k != "num_key_value_heads"}


@pytest.mark.parametrize(
    ("config", "checkpoint", "fragment"),
    [
        # Was ZeroDivisionError in the planner (KV tokens = KV bytes // KV bytes per token, which was 0).
        pytest.param(
            {**QWEN25_05B, "hidden_size": 8, "num_attention_heads": 16, "num_key_value_heads": 16},
            None,
            "hidden_size=8 is smaller than num_attention_heads=16: head_dim (hidden_size // num_attention_heads) "
            "would be 0; set head_dim",
            id="head-dim-zero",
        ),
        pytest.param(
            {**NO_KV_HEADS, "num_attention_heads": 10**18},
            None,
            "num_attention_heads=1000000000000000000 is beyond any real model (at most 16384)",
            id="absurd-head-count",
        ),
        # Was OverflowError (int too large to convert to float) in the planner's GiB arithmetic.
        pytest.param(
            {**LLAMA_8B, "vocab_size": 10**400}, None, "vocab_size=(a 1329-bit integer) is beyond", id="huge-vocab"
        ),
        pytest.param(
            {**LLAMA_8B, "vocab_size": 10**20}, None, "vocab_size=100000000000000000000 is beyond", id="big-vocab"
        ),
        pytest.param(
            {**LLAMA_8B, "hidden_size": 10**5000}, None, "hidden_size=(a 16610-bit integer)", id="huge-hidden"
        ),
        # Was ValueError (Exceeds the limit (4300 digits) for integer string conversion) building the message.
        pytest.param(
            {**LLAMA_8B, "model_type": 10**5000}, None, "model_type=(a 16610-bit integer) is not", id="huge-type"
        ),
        pytest.param({**LLAMA_8B, "hidden_size": 0}, None, "hidden_size=0 is not a positive integer", id="zero-hidden"),
        pytest.param(
            {**LLAMA_8B, "num_hidden_layers": -1}, None, "num_hidden_layers=-1 is not a positive", id="neg-layers"
        ),
        pytest.param({**LLAMA_8B, "head_dim": 0}, None, "head_dim=0 is not a positive integer", id="zero-head-dim"),
        pytest.param(
            {**LLAMA_8B, "head_dim": 2.5}, None, "head_dim=2.5 is not a positive integer", id="float-head-dim"
        ),
        pytest.param(
            {**LLAMA_8B, "num_key_value_heads": 64},
            None,
            "num_attention_heads=32 is not a multiple of num_key_value_heads=64",
            id="kv-heads-beyond-heads",
        ),
        # Were silently accepted: "false" counted as tied embeddings; True as a 1-token context.
        pytest.param(
            {**LLAMA_8B, "tie_word_embeddings": "false"},
            None,
            "tie_word_embeddings='false' is not true or false",
            id="str-tie",
        ),
        pytest.param(
            {**LLAMA_8B, "max_position_embeddings": True},
            None,
            "max_position_embeddings=True is not a positive integer",
            id="bool-context",
        ),
        pytest.param(
            {**LLAMA_8B, "max_position_embeddings": 10**400},
            None,
            "max_position_embeddings=(a 1329-bit",
            id="huge-context",
        ),
        # The Hub's safetensors index: 0 and -5 planned 0 and -6 weight bytes; 10**400 was an OverflowError.
        pytest.param(LLAMA_8B, 0, "total_size=0 is not a checkpoint size", id="checkpoint-zero"),
        pytest.param(LLAMA_8B, -5, "total_size=-5 is not a checkpoint size", id="checkpoint-negative"),
        pytest.param(LLAMA_8B, 10**400, "total_size=(a 1329-bit integer) is not a checkpoint", id="checkpoint-huge"),
    ],
)
def test_bad_model_config_regressions(config, checkpoint, fragment):
    with pytest.raises(UnsupportedModel) as caught:
        size_model(config, DType.BFLOAT16, checkpoint_total_bytes=checkpoint)
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    ("labels", "allocatable", "fragment"),
    [
        # Was AttributeError ('int' object has no attribute 'isdigit'): an unquoted number in a YAML node file.
        pytest.param(
            {t.NUMA_NODES_LABEL: 2},
            {},
            "label cpullm.io/numa-nodes=2 is not a string (quote it in YAML)",
            id="int-label",
        ),
        pytest.param({t.NFD_SMT: True}, {}, "cpu-hardware_multithreading=True is not a string", id="bool-label"),
        pytest.param({"team": None}, {}, "label team=None is not a string", id="null-label"),
        # Was decimal.Overflow out of parse_quantity.
        pytest.param({}, {"cpu": "1e999999999"}, "allocatable cpu: not a quantity: '1e999999999'", id="cpu-overflow"),
        # Was a profile with -1 CPUs.
        pytest.param({}, {"cpu": "-1"}, "allocatable cpu='-1' is negative", id="negative-cpu"),
        pytest.param({}, {"memory": "-64Gi"}, "allocatable memory='-64Gi' is negative", id="negative-memory"),
        # Was a profile with a 401-digit memory size.
        pytest.param({}, {"memory": "1e400"}, "allocatable memory: quantity out of range: '1e400'", id="huge-memory"),
        pytest.param({}, {"memory": 10**5000}, "allocatable memory: quantity out of range", id="huge-int-memory"),
        pytest.param({}, {"cpu": "1Zi"}, "allocatable cpu: not a quantity: '1Zi'", id="unknown-suffix"),
        pytest.param({}, {"cpu": None}, "allocatable cpu: not a quantity: NoneType", id="null-cpu"),
    ],
)
def test_bad_node_regressions(labels, allocatable, fragment):
    obj = node_object("n1", numa=None, labels={})
    obj["metadata"]["labels"].update(labels)
    obj["status"]["allocatable"].update(allocatable)
    with pytest.raises(NodeLabelError) as caught:
        t.parse_node(obj)
    assert caught.value.message.startswith("node n1: ")
    assert fragment in caught.value.message


def _with(path: tuple[str, ...], value: Any, *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    raw = copy.deepcopy(BASE_SPEC)
    for key in drop:
        del raw[key]
    _container(raw, path)[path[-1]] = value
    return raw


INT64_FRAGMENT = "holds an integer beyond int64"


@pytest.mark.parametrize(
    ("raw", "reason", "fragment"),
    [
        # Were OverflowError out of decide (the planner's float arithmetic on GiB).
        pytest.param(
            _with(("model", "weightsBytes"), 10**400),
            "InvalidSpec",
            f"spec.model.weightsBytes: Value error, {INT64_FRAGMENT}",
            id="huge-weights-bytes",
        ),
        pytest.param(
            _with(("kvCacheGiB",), 10**400),
            "InvalidSpec",
            f"spec.kvCacheGiB: Value error, {INT64_FRAGMENT}",
            id="huge-kv",
        ),
        pytest.param(
            _with(("maxNumSeqs",), 10**400, drop=("kvCacheGiB",)),
            "InvalidSpec",
            "spec.maxNumSeqs: Value error",
            id="huge-seqs",
        ),
        pytest.param(
            _with(("maxModelLen",), 10**400, drop=("kvCacheGiB",)),
            "InvalidSpec",
            "spec.maxModelLen: Value error",
            id="huge-len",
        ),
        pytest.param(
            _with(("cpu", "cpusPerRank"), 2**63), "InvalidSpec", "spec.cpu.cpusPerRank: Value error", id="cpus-2**63"
        ),
        pytest.param(
            _with(("affinity", "podAffinity"), {"x": [10**400]}),
            "InvalidSpec",
            "spec.affinity.podAffinity: Value error",
            id="nested-huge",
        ),
        # Was ZeroDivisionError out of decide.
        pytest.param(
            _with(
                ("model", "config"),
                {**QWEN25_05B, "hidden_size": 8, "num_attention_heads": 16, "num_key_value_heads": 16},
            ),
            "UnsupportedModel",
            "hidden_size=8 is smaller than num_attention_heads=16",
            id="inline-head-dim-zero",
        ),
        # Was fixed earlier in core/eligibility.py; kept here so it stays fixed.
        pytest.param(
            _with(("affinity", "nodeAffinity"), "amd64"),
            "InvalidSpec",
            "spec.affinity.nodeAffinity: should be an object with requiredDuringSchedulingIgnoredDuringExecution",
            id="affinity-string",
        ),
        pytest.param(
            _with(("kvCacheGiB",), 0), "InvalidSpec", "spec.kvCacheGiB: Input should be greater", id="zero-kv"
        ),
        pytest.param(
            _with(("replicas",), -1), "InvalidSpec", "spec.replicas: Input should be greater", id="negative-replicas"
        ),
    ],
)
def test_bad_spec_regressions(raw, reason, fragment):
    planned = _decide(raw)["Planned"]
    assert (planned["status"], planned["reason"]) == ("False", reason)
    assert fragment in planned["message"]
