"""Fuzzed input through the real API server: CpuLLMService specs and nodes with garbage in every
field. What the schema or its CEL rules reject never reaches the operator; everything the API server accepts
must end as a Planned condition for its generation with a known reason and a message, while the operator logs
no traceback and goes on reconciling other services. Deterministic (derandomize, no example database): every
run sends the same inputs; the unit fuzz (tests/unit/test_fuzz_core.py) covers the pure core in depth."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from testbed.objects import E2E_LABEL, QWEN_SMALL, fake_node, tiny_service
from testbed.operator import InClusterOperator, Operator
from testbed.tools import Kubectl, eventually

from cpullm import errors
from e2e.support import LogMark, NodePool, conditions, ready

REASONS = {"Planned"} | {
    cls.reason for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, errors.CpuLLMError)
}
REASONS -= {"Error", "ApiUnavailable"}  # the base class's, and a transient one: neither is an answer to a spec
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=3, suppress_health_check=list(HealthCheck))
SERIAL = itertools.count()

# Garbage of every JSON kind, with the boundaries sizes care about; quantities in every legal form.
JUNK = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([10**9, 2**31, 2**53, 10**18, -(10**18)]),
    st.floats(-1e12, 1e12, allow_nan=False),
    st.text(max_size=5),
    st.none(),
    st.booleans(),
)
QUANTITY = st.one_of(
    st.sampled_from(["1Gi", "512Mi", "1.5Gi", "1G", "1e9", "1E3", "100m", "0.5", "0", "-1Gi", "64", "1Ti", "2Ei"]),
    st.text(max_size=6),
    st.integers(-5, 10**12),
)
LABEL_VALUE = st.one_of(st.sampled_from(["true", "2", "0", "-1", "amx", "", "x" * 63]), st.text(max_size=8))
SIZES = st.one_of(st.integers(1, 8192), JUNK)
MODEL_CONFIG = st.fixed_dictionaries(
    {},
    optional={
        key: SIZES
        for key in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "max_position_embeddings",
        )
    }
    | {"model_type": st.one_of(st.sampled_from(["qwen2", "llama", "mixtral", ""]), JUNK)},
)
SPEC_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "kvCacheGiB": st.one_of(st.integers(-2, 64), JUNK),
    "maxModelLen": st.one_of(st.integers(-1, 10**6), JUNK),
    "maxNumSeqs": st.one_of(st.integers(-1, 512), JUNK),
    "replicas": st.one_of(st.integers(-1, 4), JUNK),
    "tensorParallelSize": st.one_of(st.integers(-1, 9), JUNK),
    "placement": st.one_of(st.sampled_from(["tensorParallel", "throughput", "auto", "TP"]), JUNK),
    "cpu": st.one_of(st.fixed_dictionaries({}, optional={"cpusPerRank": st.one_of(st.integers(-1, 300), JUNK)}), JUNK),
    "nodeSelector": st.one_of(st.dictionaries(st.sampled_from(["pool", "bad key!", "cpullm.io/x"]), LABEL_VALUE), JUNK),
    "memoryOverheadBytes": QUANTITY,
    "shmSize": QUANTITY,
    "env": st.one_of(st.lists(st.fixed_dictionaries({"name": st.text(max_size=4), "value": JUNK}), max_size=2), JUNK),
}


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec that starts from the suite's tiny service and has some fields replaced by anything at all."""
    spec = copy.deepcopy(QWEN_SMALL["spec"])
    spec.update(kvCacheGiB=1, maxModelLen=4096, cpu={"cpusPerRank": 2})
    for key, strategy in SPEC_FIELDS.items():
        if draw(st.booleans()):
            spec[key] = draw(strategy)
    if draw(st.booleans()):
        spec["model"]["config"] = {**spec["model"]["config"], **draw(MODEL_CONFIG)}
    return spec


@pytest.fixture(scope="module")
def api(kubectl: Kubectl) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(config_file=kubectl.kubeconfig))


@pytest.fixture
def canary(kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str) -> Iterator[str]:
    """A healthy service that must keep being reconciled while the fuzzed ones are refused."""
    kubectl.apply(tiny_service("canary", namespace))
    ready(kubectl, namespace, "canary", 1)
    yield "canary"
    kubectl.run("scale", "cpullm", "canary", "-n", namespace, "--replicas=2")
    ready(kubectl, namespace, "canary", 2)


def answered(service: dict[str, Any]) -> dict[str, Any]:
    """The Planned condition for the object's current generation, checked for a known reason and a message."""
    planned = conditions(service).get("Planned", {})
    name = service["metadata"]["name"]
    assert planned.get("observedGeneration") == service["metadata"]["generation"], (name, planned)
    assert planned["reason"] in REASONS, (name, planned)
    assert planned["message"] and "Traceback" not in planned["message"], (name, planned)
    return planned


@FUZZ
@given(batch=st.lists(specs(), min_size=25, max_size=25))
def test_fuzzed_specs_are_rejected_by_the_schema_or_answered_with_a_condition(
    kubectl: Kubectl,
    api: client.CustomObjectsApi,
    operator: Operator | InClusterOperator,
    namespace: str,
    canary: str,
    batch: list[dict[str, Any]],
):
    mark = LogMark(operator) if isinstance(operator, Operator) else None
    accepted: list[str] = []
    for spec in batch:
        body = tiny_service(f"fuzz-{next(SERIAL)}", namespace)
        body["spec"] = spec
        try:
            api.create_namespaced_custom_object("cpullm.io", "v1alpha1", namespace, "cpullmservices", body)
        except ApiException as err:
            assert err.status in (400, 422), (err.status, err.body, json.dumps(spec, default=str))
            continue
        accepted.append(body["metadata"]["name"])

    def all_answered() -> bool:
        services = {s["metadata"]["name"]: s for s in kubectl.get("cpullm", namespace=namespace)}
        for name in accepted:
            answered(services[name])
        return True

    eventually(all_answered, timeout=90, interval=1, what=f"{len(accepted)} accepted specs answered")
    if mark is not None:
        mark.assert_quiet()
    for name in accepted:  # room for the next batch; the namespace goes at the end
        kubectl.run("delete", "cpullm", name, "-n", namespace, "--wait=false")


LONG_CONTEXT = {"max_position_embeddings": 2**21}  # a context one 1 GiB KV cache cannot hold a sequence of
HUGE = {  # a 25 TB dense model: no node holds its weights
    "num_hidden_layers": 16000,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}


@pytest.mark.parametrize(
    ("change", "reason", "fragment"),
    [
        pytest.param(
            {"model": {"name": "huge", "config": {**QWEN_SMALL["spec"]["model"]["config"], **HUGE}}},
            "ModelTooLarge",
            "the weights alone need",
            id="model-too-large-is-not-no-eligible-node",
        ),
        pytest.param(
            {
                "model": {"name": "long", "config": {**QWEN_SMALL["spec"]["model"]["config"], **LONG_CONTEXT}},
                "kvCacheGiB": 1,
                "maxModelLen": 10**6,
            },
            "KVCacheTooSmall",
            "less than one sequence",
            id="kv-too-small",
        ),
        pytest.param(
            {"kvCacheGiB": 1, "maxModelLen": 10**6},
            "MaxModelLenTooLong",
            "longer than the model's context of 32768 tokens",
            id="context-beyond-the-model",
        ),
        pytest.param(
            {"model": {"name": "bad", "config": {**QWEN_SMALL["spec"]["model"]["config"], "hidden_size": 8}}},
            "UnsupportedModel",
            "hidden_size=8 is smaller than num_attention_heads",
            id="hidden-smaller-than-heads",
        ),
        pytest.param(
            {"nodeSelector": {"pool": "nowhere"}}, "NoEligibleNode", "pool=nowhere does not match", id="no-match"
        ),
    ],
)
def test_refusals_carry_the_right_reason(
    kubectl: Kubectl,
    operator: Operator | InClusterOperator,
    namespace: str,
    change: dict[str, Any],
    reason: str,
    fragment: str,
):
    service = tiny_service("refused", namespace)
    service["spec"].update(change)
    kubectl.apply(service)

    def refused() -> dict[str, Any]:
        planned = answered(kubectl.get("cpullm", "refused", namespace))
        assert (planned["status"], planned["reason"]) == ("False", reason), planned
        return planned

    assert fragment in eventually(refused, timeout=60, what=reason)["message"]


NODE_LABELS = st.dictionaries(
    st.sampled_from(
        [
            "cpullm.io/numa-nodes",
            "cpullm.io/isa.avx2",
            "cpullm.io/isa.amx_bf16",
            "cpullm.io/topology-manager-policy",
            "feature.node.kubernetes.io/cpu-hardware_multithreading",
            "feature.node.kubernetes.io/cpu-cpuid.AVX512F",
            "kubernetes.io/arch",
        ]
    ),
    LABEL_VALUE,
    max_size=4,
)


@FUZZ
@given(nodes_drawn=st.lists(st.tuples(NODE_LABELS, QUANTITY, QUANTITY), min_size=8, max_size=8))
def test_fuzzed_nodes_never_stop_the_operator(
    kubectl: Kubectl,
    operator: Operator | InClusterOperator,
    namespace: str,
    nodes: NodePool,
    canary: str,
    nodes_drawn: list[tuple[dict[str, str], Any, Any]],
):
    """Nodes with garbage labels and allocatable values (those the API server takes) go into the node index
    next to the canary's nodes: no traceback, and the canary is still reconciled (the fixture scales it)."""
    mark = LogMark(operator) if isinstance(operator, Operator) else None
    for i, (labels, cpu, memory) in enumerate(nodes_drawn):
        node = fake_node(f"fuzz-{namespace[-5:]}-{next(SERIAL)}-{i}", cpu=str(cpu), memory=str(memory))
        node["metadata"]["labels"] = {k: v for k, v in {**node["metadata"]["labels"], **labels}.items()}
        node["metadata"]["labels"].pop(E2E_LABEL, None)  # never a candidate for the suite's services
        if kubectl.apply(node, check=False).returncode == 0:
            nodes.names.add(node["metadata"]["name"])
    kubectl.run("scale", "cpullm", canary, "-n", namespace, "--replicas=1")
    ready(kubectl, namespace, canary, 1)
    if mark is not None:
        mark.assert_quiet()
