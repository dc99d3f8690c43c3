"""Node selector terms from the labels that made nodes eligible (core/node_selection.py): exact terms, their
stability as nodes of a shape come and go, how they combine with the user's, and what they match."""

import pytest

from cpullm.api.spec import NodeSelectorTerm
from cpullm.core.children.common import Owner
from cpullm.core.children.deployment import build_deployment
from cpullm.core.eligibility import _matches_term
from cpullm.core.node_selection import combine_terms, shape_node_terms
from cpullm.core.planner import plan_service
from cpullm.core.topology import parse_node

from .builders import NFD, llama_8b, node, node_object, spec

ARCH = "kubernetes.io/arch"
NUMA = "cpullm.io/numa-nodes"
NFD_NUMA = NFD + "memory-numa.node_count"
SMT = NFD + "cpu-hardware_multithreading"
CPU_MANAGER = "cpullm.io/cpu-manager-policy"
TOPOLOGY = "cpullm.io/topology-manager-policy"
AMX_OVERRIDE = "cpullm.io/isa.amx_bf16"
AMX_NFD = NFD + "cpu-cpuid.AMXBF16"


def is_(key, value):
    return {"key": key, "operator": "In", "values": [value]}


def absent(key):
    return {"key": key, "operator": "DoesNotExist"}


def nameless_arch_node(name):
    """A node whose arch comes from status.nodeInfo, not the kubernetes.io/arch label."""
    raw = node_object(name, numa=2)
    del raw["metadata"]["labels"][ARCH]
    raw["status"]["nodeInfo"] = {"architecture": "amd64"}
    return parse_node(raw)


# The term of a node with 2 NUMA nodes (its label) and no SMT, CPU manager or topology manager labels; each
# expression given replaces the default of its key or adds one. Sorted by key, as the planner writes them.
def term(*expressions, arch="amd64"):
    defaults = (absent(CPU_MANAGER), is_(NUMA, "2"), absent(TOPOLOGY), absent(SMT), is_(ARCH, arch))
    by_key = {expression["key"]: expression for expression in (*defaults, *expressions)}
    return {"matchExpressions": sorted(by_key.values(), key=lambda expression: expression["key"])}


NFD_NUMA_2 = term(absent(NUMA), is_(NFD_NUMA, "2"))

SHAPE_TERM_CASES = [
    pytest.param(
        [node("a", numa=2), node("b", numa=2)],
        [],
        [term()],
        id="alike-nodes-give-one-term",
    ),
    pytest.param(
        [node("a", numa=None, labels={NFD_NUMA: "4"})],
        [],
        [term(absent(NUMA), is_(NFD_NUMA, "4"))],
        id="numa-from-nfd-and-no-override",
    ),
    pytest.param(
        [node("a", numa=None)],
        [],
        [term(absent(NUMA), absent(NFD_NUMA))],
        id="numa-from-neither-label",
    ),
    pytest.param(
        [node("a", numa=2, labels={NFD_NUMA: "2"})],
        [],
        [term()],
        id="numa-label-wins-over-nfd",
    ),
    pytest.param(
        [node("a", numa=2)],
        ["amx_bf16"],
        [term({"key": AMX_OVERRIDE, "operator": "NotIn", "values": ["false"]}, is_(AMX_NFD, "true"))],
        id="isa-from-nfd-guarded-against-override",
    ),
    pytest.param(
        [node("a", numa=2, flags=(), labels={AMX_OVERRIDE: "true"})],
        ["amx_bf16"],
        [term(is_(AMX_OVERRIDE, "true"))],
        id="isa-from-override",
    ),
    pytest.param(
        [node("a", numa=2, labels={AMX_OVERRIDE: "true"})],
        ["amx_bf16"],
        [term(is_(AMX_OVERRIDE, "true"))],
        id="override-true-wins-over-nfd",
    ),
    pytest.param(
        [node("a", numa=2, smt=True, policy="static", labels={TOPOLOGY: "single-numa-node"})],
        [],
        [term(is_(CPU_MANAGER, "static"), is_(TOPOLOGY, "single-numa-node"), is_(SMT, "true"))],
        id="smt-cpu-and-topology-manager-labels-present",
    ),
    pytest.param(
        [node("a", numa=2, smt=False, policy="none")],
        [],
        [term(is_(CPU_MANAGER, "none"), is_(SMT, "false"))],
        id="smt-false-and-cpu-manager-none",
    ),
    pytest.param(
        [node("a", numa=2), node("b", numa=None, labels={NFD_NUMA: "2"})],
        [],
        [
            NFD_NUMA_2,  # sorts first: DoesNotExist < In on cpullm.io/numa-nodes
            term(),
        ],
        id="two-ways-of-labelling-give-two-terms",
    ),
    pytest.param(
        [node("a", numa=2, arch="arm64", flags=())],
        [],
        [term(arch="arm64")],
        id="arm64",
    ),
    pytest.param(
        [nameless_arch_node("z"), nameless_arch_node("y"), node("a", numa=2)],
        [],
        [
            term(),
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["y"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["z"]}]},
        ],
        id="no-arch-label-falls-back-to-node-names",
    ),
]


@pytest.mark.parametrize(("nodes", "required_isa", "terms"), SHAPE_TERM_CASES)
def test_shape_node_terms(nodes, required_isa, terms):
    assert shape_node_terms(nodes, required_isa) == terms


def term_matches(term: dict, node) -> bool:
    """Whether the scheduler would put a pod there: the eligibility chain's own match, on the term as rendered."""
    return _matches_term(NodeSelectorTerm.model_validate(term), node)


@pytest.mark.parametrize(("nodes", "required_isa", "terms"), SHAPE_TERM_CASES)
def test_every_chosen_node_matches_its_terms(nodes, required_isa, terms):
    """Each chosen node is matched by one of its terms (the scheduler may put the pod there)."""
    produced = shape_node_terms(nodes, required_isa)
    for chosen in nodes:
        assert any(term_matches(term, chosen) for term in produced), chosen.name


BASE = node("a", numa=2, smt=True, policy="static", labels={TOPOLOGY: "single-numa-node"})
BASE_KWARGS = {"numa": 2, "smt": True, "policy": "static", "labels": {TOPOLOGY: "single-numa-node"}}


def like_base(name, **changes):
    kwargs = {**BASE_KWARGS, **changes}
    return node(name, **kwargs)


@pytest.mark.parametrize(
    ("other", "matches"),
    [
        pytest.param(like_base("same"), True, id="labelled-alike"),
        # CPU count and memory are no labels: the scheduler's resource fit keeps pods off smaller nodes.
        pytest.param(like_base("bigger", cpu="128", memory="1Ti"), True, id="other-size-matches"),
        pytest.param(like_base("arm", arch="arm64"), False, id="other-arch"),
        pytest.param(like_base("numa4", numa=4), False, id="other-numa-count"),
        pytest.param(
            like_base("numa-nfd", numa=None, labels={**BASE_KWARGS["labels"], NFD_NUMA: "2"}), False, id="numa-from-nfd"
        ),
        pytest.param(like_base("nosmt", smt=False), False, id="other-smt"),
        pytest.param(like_base("nopolicy", policy=None), False, id="no-cpu-manager-label"),
        pytest.param(like_base("besteffort", labels={TOPOLOGY: "best-effort"}), False, id="other-topology-policy"),
        pytest.param(
            like_base("vetoed", labels={**BASE_KWARGS["labels"], AMX_OVERRIDE: "false"}), False, id="isa-vetoed"
        ),
        pytest.param(like_base("no-amx", flags=("AVX2", "AVX512F")), False, id="isa-missing"),
    ],
)
def test_terms_do_not_match_nodes_of_another_shape(other, matches):
    terms = shape_node_terms([BASE], ["amx_bf16"])
    assert any(term_matches(term, BASE) for term in terms)
    assert any(term_matches(term, other) for term in terms) is matches


STABLE_POOLS = [
    pytest.param({"numa": 2}, {}, id="numa-label"),
    pytest.param({"numa": None, "labels": {NFD_NUMA: "2"}}, {}, id="nfd-numa"),
    pytest.param(
        {"numa": 2, "flags": (), "labels": {AMX_OVERRIDE: "true"}},
        {"cpu": {"requiredISA": ["amx_bf16"]}},
        id="isa-override",
    ),
    pytest.param(
        {"numa": 4, "smt": True, "policy": "static", "labels": {TOPOLOGY: "single-numa-node"}},
        {"placement": "throughput", "replicas": 3, "kvCacheGiB": 1, "maxModelLen": 8192},
        id="throughput-aligned",
    ),
    pytest.param(
        {"numa": 2, "labels": {"pool": "llm", "zone": "z1"}},
        {
            "nodeSelector": {"pool": "llm"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
                        ]
                    }
                }
            },
        },
        id="user-selector-and-affinity",
    ),
]


@pytest.mark.parametrize(("labels", "fields"), STABLE_POOLS)
def test_a_node_joining_or_leaving_the_pool_leaves_the_pod_template_as_it_was(labels, fields):
    service = spec(**fields)
    owner = Owner(name="llm", namespace="serving", uid="uid-1")
    pools = {
        "a": [node("a", **labels)],
        "a,b": [node("a", **labels), node("b", **labels)],
        "a,b,c": [node("a", **labels), node("b", **labels), node("c", **labels)],
    }
    plans = {key: plan_service(service, llama_8b(), nodes) for key, nodes in pools.items()}
    assert {key: p.eligible_nodes for key, p in plans.items()} == {
        "a": ["a"],
        "a,b": ["a", "b"],
        "a,b,c": ["a", "b", "c"],
    }
    terms = {key: p.node_selector_terms for key, p in plans.items()}
    assert len(terms["a,b"]) == 1
    assert terms["a"] == terms["a,b"] == terms["a,b,c"]
    deployments = {key: build_deployment(owner, service, p) for key, p in plans.items()}
    assert deployments["a"] == deployments["a,b"] == deployments["a,b,c"]


def test_a_node_labelled_another_way_joining_adds_a_term():
    service = spec()
    before = plan_service(service, llama_8b(), [node("a", numa=2), node("b", numa=2)])
    after = plan_service(
        service, llama_8b(), [node("a", numa=2), node("b", numa=2), node("c", numa=None, labels={NFD_NUMA: "2"})]
    )
    assert before.node_selector_terms == [term()]
    assert after.node_selector_terms == [NFD_NUMA_2, term()]


U1 = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
U2 = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}
U3 = {
    "matchExpressions": [{"key": "pool", "operator": "Exists"}],
    "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}],
}
S1 = {"matchExpressions": [is_(ARCH, "amd64"), is_(NUMA, "2")]}
S2 = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}


@pytest.mark.parametrize(
    ("user", "shape", "combined"),
    [
        pytest.param([], [S1], [S1], id="no-user-terms"),
        pytest.param([], [S1, S2], [S1, S2], id="no-user-terms-two-shape-terms"),
        pytest.param(
            [U1, U2],
            [S1],
            [
                {"matchExpressions": [*U1["matchExpressions"], *S1["matchExpressions"]]},
                {"matchExpressions": S1["matchExpressions"], "matchFields": U2["matchFields"]},
            ],
            id="two-user-terms-one-shape-term",
        ),
        pytest.param(
            [U1, U3],
            [S1, S2],
            [
                {"matchExpressions": [*U1["matchExpressions"], *S1["matchExpressions"]]},
                {"matchExpressions": U1["matchExpressions"], "matchFields": S2["matchFields"]},
                {
                    "matchExpressions": [*U3["matchExpressions"], *S1["matchExpressions"]],
                    "matchFields": U3["matchFields"],
                },
                {
                    "matchExpressions": U3["matchExpressions"],
                    "matchFields": [*U3["matchFields"], *S2["matchFields"]],
                },
            ],
            id="cross-product-user-first",
        ),
    ],
)
def test_combine_terms_ands_every_user_term_with_every_shape_term(user, shape, combined):
    assert combine_terms(user, shape) == combined
