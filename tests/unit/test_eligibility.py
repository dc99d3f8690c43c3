"""The eligibility chain (core/eligibility.py): its order, the shape of spec.affinity, and the topology manager
label it relies on."""

from itertools import combinations
from typing import Any

import pytest
from pydantic import ValidationError

from cpullm.api.spec import parse_spec
from cpullm.core.eligibility import ELIGIBILITY_CHECKS, Needs, node_rejection
from cpullm.core.node_facts import refine_profiles
from cpullm.core.node_topology import parse_topology
from cpullm.core.planner import plan_service
from cpullm.core.topology import parse_node
from cpullm.errors import InvalidSpec, NodeLabelError, NoEligibleNode

from .builders import llama_8b, node, node_object, spec, topology_object

ORDER = ["schedulable", "image", "numa-count", "isa", "kernels", "nodeSelector", "nodeAffinity", "taints"]
REQUIRED = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"

ZONE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]
        }
    }
}
# For each check: what makes a node fail it (node builder arguments, spec fields) and the rejection it gives.
FAILURES = {
    "schedulable": ({"unschedulable": True}, {}, "unschedulable (cordoned)"),
    "image": ({"arch": "s390x"}, {}, "arch s390x has no default vLLM CPU image (set spec.image)"),
    # NFD's default labels on a two-socket node: multi-NUMA, no count (the chart's NodeFeatureRule publishes it).
    "numa-count": (
        {"numa": None, "labels": {"feature.node.kubernetes.io/memory-numa": "true"}},
        {},
        "NUMA count unknown (feature.node.kubernetes.io/memory-numa=true: more than one NUMA node, no "
        "cpullm.io/numa-nodes or feature.node.kubernetes.io/memory-numa.node_count): install the chart with "
        "nodeFeatureRule.enabled=true (NFD then publishes the count), or label the node cpullm.io/numa-nodes=N",
    ),
    "isa": ({}, {"cpu": {"requiredISA": ["sve"]}}, "lacks ISA sve"),
    "kernels": ({"flags": ("AVX2",)}, {"kvCacheDtype": "fp8"}, "lacks avx512f for an fp8 KV cache"),
    "nodeSelector": ({}, {"nodeSelector": {"pool": "llm"}}, "nodeSelector pool=llm does not match"),
    "nodeAffinity": ({}, {"affinity": ZONE_AFFINITY}, "required node affinity does not match"),
    "taints": (
        {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]},
        {},
        "taint dedicated=gpu:NoSchedule not tolerated",
    ),
}


def test_the_chain_is_in_the_documented_order():
    assert [check.name for check in ELIGIBILITY_CHECKS] == ORDER


@pytest.mark.parametrize("name", ORDER)
def test_each_check_alone_gives_its_rejection(name):
    node_kwargs, fields, why = FAILURES[name]
    assert node_rejection(Needs.of(spec(**fields)), node("n", **node_kwargs)) == why


@pytest.mark.parametrize(
    ("first", "later"),
    [pytest.param(a, b, id=f"{a}-before-{b}") for a, b in combinations(ORDER, 2)],
)
def test_a_node_failing_several_checks_is_rejected_by_the_first(first, later):
    node_kwargs = {**FAILURES[first][0], **FAILURES[later][0]}
    fields = {**FAILURES[first][1], **FAILURES[later][1]}
    service, candidate = spec(**fields), node("n", **node_kwargs)
    assert node_rejection(Needs.of(service), candidate) == FAILURES[first][2]
    with pytest.raises(NoEligibleNode) as refused:
        plan_service(service, llama_8b(), [candidate])
    assert refused.value.rejections == {"n": FAILURES[first][2]}


def required(*terms: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expression(**fields: Any) -> dict[str, Any]:
    return {"matchExpressions": [fields]}


TERMS = f"{REQUIRED}.nodeSelectorTerms"


@pytest.mark.parametrize(
    ("affinity", "path", "problem"),
    [
        pytest.param({"nodeAffinity": "zone=z1"}, "spec.affinity.nodeAffinity", "should be an object", id="str"),
        pytest.param(
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"nodeSelectorTerms": []}]}},
            REQUIRED,
            "should be an object",
            id="required-list",
        ),
        pytest.param(required({"a": 1}), f"{TERMS}.0.a", "no such field", id="term-extra"),
        pytest.param(
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": {"a": 1}}}},
            TERMS,
            "valid list",
            id="terms-dict",
        ),
        pytest.param(required("zone"), f"{TERMS}.0", "should be an object", id="term-str"),
        pytest.param(
            required(expression(key="zone", operator="Exists"), {"matchExpressions": ["zone=z1"]}),
            f"{TERMS}.1.matchExpressions.0",
            "should be an object",
            id="expression-str",
        ),
        pytest.param(
            required({"matchFields": {"key": "metadata.name"}}), f"{TERMS}.0.matchFields", "valid list", id="fields"
        ),
        pytest.param(
            required(expression(key="zone", operator="In", values="z1")),
            f"{TERMS}.0.matchExpressions.0.values",
            "valid list",
            id="values-string",
        ),
        pytest.param(
            required(expression(key="zone", operator="Near")),
            f"{TERMS}.0.matchExpressions.0.operator",
            "'In', 'NotIn', 'Exists', 'DoesNotExist', 'Gt' or 'Lt'",
            id="unknown-operator",
        ),
        pytest.param(
            required(expression(key="", operator="Exists")), f"{TERMS}.0.matchExpressions.0.key", "at least 1", id="key"
        ),
        *[
            pytest.param(
                required(expression(key="k", operator=op, **values)),
                f"{TERMS}.0.matchExpressions.0",
                f"values must be {what} for operator {op}",
                id=f"{op}-{'-'.join(values.get('values', ['none']))}",
            )
            # What a pod refuses: the API server refuses such a CpuLLMService too (the schema's types), and
            # parse_spec says why for one that reached the operator another way (an older CRD).
            for op, values, what in (
                ("Gt", {"values": ["abc"]}, "one integer"),
                ("Lt", {"values": ["1", "2"]}, "one integer"),
                ("Gt", {}, "one integer"),
                ("Lt", {"values": ["99999999999999999999"]}, "one integer"),
                ("In", {}, "non-empty"),
                ("Exists", {"values": ["x"]}, "empty"),
            )
        ],
    ],
)
def test_malformed_affinity_is_an_invalid_spec_naming_the_path(affinity, path, problem):
    with pytest.raises(InvalidSpec) as refused:
        parse_spec({**spec().model_dump(by_alias=True, exclude_none=True), "affinity": affinity})
    message = refused.value.message
    assert message.startswith(f"{path}: ") and problem in message, message


@pytest.mark.parametrize(
    ("affinity", "terms"),
    [
        pytest.param(None, [], id="none"),
        pytest.param({}, [], id="empty"),
        pytest.param({"podAntiAffinity": {"x": 1}}, [], id="no-node-affinity"),
        pytest.param(
            {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}, [], id="preferred-only"
        ),
        pytest.param(
            ZONE_AFFINITY,
            ZONE_AFFINITY["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
            id="required",
        ),
    ],
)
def test_well_formed_affinity_gives_its_required_terms(affinity, terms):
    parsed = spec(affinity=affinity).affinity
    found = parsed.required_node_terms if parsed else []
    assert [t.model_dump(by_alias=True, exclude_defaults=True) for t in found] == terms
    if parsed is not None:  # passed to the pods as written
        assert parsed.as_pod_affinity() == affinity


@pytest.mark.parametrize(("operator", "bound", "label", "matches"), [
    ("Gt", "4", "8", True), ("Gt", "4", "4", False), ("Lt", "-1", "-2", True), ("Gt", "4", "eight", False),
])  # fmt: skip
def test_gt_and_lt_compare_integers(operator, bound, label, matches):
    term = {"matchExpressions": [{"key": "cores", "operator": operator, "values": [bound]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    why = node_rejection(Needs.of(spec(affinity=affinity)), node("n", labels={"cores": label}))
    assert (why is None) == matches


TOPOLOGY = "cpullm.io/topology-manager-policy"


@pytest.mark.parametrize(
    ("labels", "policy"),
    [
        pytest.param({}, None, id="absent"),
        pytest.param({TOPOLOGY: "none"}, "none", id="none"),
        pytest.param({TOPOLOGY: "best-effort"}, "best-effort", id="best-effort"),
        pytest.param({TOPOLOGY: "restricted"}, "restricted", id="restricted"),
        pytest.param({TOPOLOGY: "single-numa-node"}, "single-numa-node", id="single-numa-node"),
    ],
)
def test_topology_manager_label_is_parsed(labels, policy):
    profile = parse_node(node_object("n", labels=labels))
    assert profile.topology_manager_policy == policy


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("Single-NUMA-Node", id="wrong-case"),
        pytest.param("single_numa_node", id="underscores"),
        pytest.param("static", id="cpu-manager-value"),
        pytest.param("", id="empty"),
    ],
)
def test_a_garbage_topology_manager_label_is_a_node_label_error(value):
    with pytest.raises(NodeLabelError) as refused:
        parse_node(node_object("n", labels={TOPOLOGY: value}))
    assert refused.value.message == (
        f"node n: label {TOPOLOGY}={value!r} is not one of none, best-effort, restricted, single-numa-node"
    )


NFD_MULTI_NUMA = {"feature.node.kubernetes.io/memory-numa": "true"}


@pytest.mark.parametrize(
    ("labels", "topology", "planned"),
    [
        pytest.param(NFD_MULTI_NUMA, False, None, id="nfd-default-two-socket-refused-with-the-fix"),
        pytest.param(
            {**NFD_MULTI_NUMA, "feature.node.kubernetes.io/memory-numa.node_count": "2"},
            False,
            (2, "feature.node.kubernetes.io/memory-numa.node_count"),
            id="nfd-with-the-charts-rule",
        ),
        pytest.param({**NFD_MULTI_NUMA, "cpullm.io/numa-nodes": "2"}, False, (2, "cpullm.io/numa-nodes"), id="label"),
        pytest.param(NFD_MULTI_NUMA, True, (2, "NodeResourceTopology"), id="nfd-default-with-a-topology"),
        pytest.param({}, False, (1, "default"), id="nothing-known-one-assumed-with-a-note"),
    ],
)
def test_a_multi_numa_node_is_never_planned_with_a_guessed_numa_count(labels, topology, planned):
    """NFD's default labels say a node has several NUMA nodes (memory-numa=true) but not how many: planned as one,
    a rank would span both sockets. Refused naming the fix, unless a count comes from a label or the node's
    NodeResourceTopology."""
    profiles = [node("n1", numa=None, cpu="64", memory="512Gi", labels=labels)]
    if topology:
        profiles = refine_profiles(profiles, [parse_topology(topology_object("n1"))])
    if planned is None:
        with pytest.raises(NoEligibleNode, match=r"NUMA count unknown .* nodeFeatureRule\.enabled=true"):
            plan_service(spec(), llama_8b(), profiles)
        return
    plan = plan_service(spec(), llama_8b(), profiles)
    assert (plan.node_profile.numa_nodes, plan.node_profile.numa_source) == planned
    assert plan.tensor_parallel_size == planned[0]
    assert ("NUMA count unknown: 1 assumed" in (plan.placement_note or "")) is (planned[1] == "default")


@pytest.mark.parametrize(
    ("written", "read"),
    [
        (["AMXBF16"], ["amx_bf16"]),
        (["AVX512VNNI", "FMA3", "SSE42"], ["avx512_vnni", "fma", "sse4_2"]),
        (["AVX2", "avx2"], ["avx2"]),  # one flag, however spelt
        (["sha_ni", "movdiri"], ["sha_ni", "movdiri"]),  # lscpu names pass as written, a rarer one too
    ],
)
def test_required_isa_takes_nfds_spellings_and_plans_with_lscpus(written, read):
    assert spec(cpu={"requiredISA": written}).cpu.required_isa == read


@pytest.mark.parametrize(("typo", "meant"), [("avx512vnni", "avx512_vnni"), ("amxbf16", "amx_bf16")])
def test_a_near_miss_of_a_known_flag_is_refused_with_the_flag_meant(typo, meant):
    with pytest.raises(ValidationError, match=f"did you mean '{meant}'"):
        spec(cpu={"requiredISA": [typo]})


def test_a_node_labelled_by_nfd_is_eligible_for_a_flag_required_in_nfds_spelling():
    plan = plan_service(spec(cpu={"requiredISA": ["AMXBF16"]}), llama_8b(), [node("amx", numa=2)])
    assert plan.eligible_nodes == ["amx"]
