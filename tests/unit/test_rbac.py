"""The chart grants what the operator does with each owned kind (core/children's CHILD_KINDS) and nothing is
granted twice for it, and its write policy (a ValidatingAdmissionPolicy) covers every write of each; checked on
manifests/install.yaml, the chart rendered with its defaults (e2e/test_chart.py keeps the two equal, and tries the
policy on the API server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cpullm.core.children import CHILD_KINDS, ChildKind, owned_kinds_document
from cpullm.core.node_facts import NODE_FACT_SOURCES, NodeFactSource

INSTALL = Path(__file__).resolve().parents[2] / "manifests" / "install.yaml"


def installed(kind: str, name: str) -> dict:
    objects = [o for o in yaml.safe_load_all(INSTALL.read_text()) if o]
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def namespaced_rules() -> list[dict]:
    return list(installed("ClusterRole", "cpullm-operator")["rules"])


@pytest.mark.parametrize("child", CHILD_KINDS, ids=[k.kind for k in CHILD_KINDS])
def test_the_chart_grants_what_each_owned_kind_needs(child: ChildKind):
    rules = [r for r in namespaced_rules() if child.group in r["apiGroups"] and child.plural in r["resources"]]
    assert len(rules) == 1, f"{child.plural}.{child.group}: {len(rules)} rules"
    assert set(child.verbs) <= set(rules[0]["verbs"]), f"{child.kind} needs {child.verbs}"


def test_the_verbs_follow_what_the_operator_does_with_a_kind():
    watched = ChildKind("v1", "Service", "services", watched=True)
    optional = ChildKind("example.com/v1", "Thing", "things", crd="things.example.com")
    assert (watched.group, watched.version, watched.verbs) == (
        "",
        "v1",
        ("get", "create", "patch", "delete", "list", "watch"),
    )
    assert (optional.group, optional.version, optional.verbs) == (
        "example.com",
        "v1",
        ("get", "create", "patch", "delete", "list"),
    )


BUILT_IN = [k for k in CHILD_KINDS if k.crd is None]
# Each policy and the kinds it covers: the operator's own writes, every owned kind; everyone else's writes to the
# children, the built-in kinds (the optional ones are left out on purpose: their own controllers update them).
COVERED = [("cpullm-operator-writes", k) for k in CHILD_KINDS] + [("cpullm-operator-children", k) for k in BUILT_IN]


@pytest.mark.parametrize(("policy", "child"), COVERED, ids=[f"{p}-{k.kind}" for p, k in COVERED])
def test_each_admission_policy_covers_every_write_of_the_kinds_it_guards(policy: str, child: ChildKind):
    spec = installed("ValidatingAdmissionPolicy", policy)["spec"]
    rules = [
        r
        for r in spec["matchConstraints"]["resourceRules"]
        if child.group in r["apiGroups"] and child.plural in r["resources"]
    ]
    assert len(rules) == 1, f"{child.plural}.{child.group}: {len(rules)} rules"
    assert rules[0]["apiVersions"] == ["*"]
    assert set(rules[0]["operations"]) == {"CREATE", "UPDATE", "DELETE"}


def test_the_write_policy_matches_only_the_operators_own_requests_and_denies():
    spec = installed("ValidatingAdmissionPolicy", "cpullm-operator-writes")["spec"]
    account = installed("Deployment", "cpullm-operator")["spec"]["template"]["spec"]["serviceAccountName"]
    username = f"system:serviceaccount:cpullm-system:{account}"
    assert [c["expression"] for c in spec["matchConditions"]] == [f"request.userInfo.username == '{username}'"]
    assert spec["failurePolicy"] == "Fail"
    binding = installed("ValidatingAdmissionPolicyBinding", "cpullm-operator-writes")["spec"]
    assert binding == {"policyName": "cpullm-operator-writes", "validationActions": ["Deny"]}
    (protected,) = [v["expression"] for v in spec["variables"] if v["name"] == "protected"]
    assert yaml.safe_load(protected) == ["kube-system", "kube-public", "kube-node-lease", "cpullm-system"]


def test_the_child_policy_leaves_out_the_operator_and_kubernetes_controllers_and_denies():
    spec = installed("ValidatingAdmissionPolicy", "cpullm-operator-children")["spec"]
    account = installed("Deployment", "cpullm-operator")["spec"]["template"]["spec"]["serviceAccountName"]
    (condition,) = [c["expression"] for c in spec["matchConditions"]]
    for exempt in (
        f"request.userInfo.username != 'system:serviceaccount:cpullm-system:{account}'",
        "!request.userInfo.username.startsWith('system:serviceaccount:kube-system:')",
        "request.userInfo.username != 'system:kube-controller-manager'",
        "exists(g, g in ['system:masters','kubeadm:cluster-admins'])",
    ):
        assert exempt in condition
    assert spec["failurePolicy"] == "Fail"
    binding = installed("ValidatingAdmissionPolicyBinding", "cpullm-operator-children")["spec"]
    assert binding == {"policyName": "cpullm-operator-children", "validationActions": ["Deny"]}


@pytest.mark.parametrize("source", NODE_FACT_SOURCES, ids=[s.kind for s in NODE_FACT_SOURCES])
def test_the_chart_grants_what_each_node_fact_source_needs(source: NodeFactSource):
    """A node-fact source's objects are listed and watched cluster-wide (core/node_facts.py): its registry line
    needs its rule in the cluster role."""
    rules = installed("ClusterRole", "cpullm-operator-cluster")["rules"]
    found = [r for r in rules if source.group in r["apiGroups"] and source.plural in r["resources"]]
    assert len(found) == 1, f"{source.plural}.{source.group}: {len(found)} rules"
    assert set(source.verbs) <= set(found[0]["verbs"]), f"{source.kind} needs {source.verbs}"


def test_the_charts_list_of_owned_kinds_is_generated_from_child_kinds():
    """files/owned-kinds.json, which the chart's RBAC and policies range over, is `cpullm chart-kinds`'s output:
    regenerate it with `cpullm chart-kinds > charts/cpullm-operator/files/owned-kinds.json`."""
    generated = INSTALL.parents[1] / "charts" / "cpullm-operator" / "files" / "owned-kinds.json"
    assert json.loads(generated.read_text()) == owned_kinds_document()


@pytest.mark.parametrize("child", [k for k in CHILD_KINDS if k.pod_template], ids=lambda k: k.kind)
def test_the_policy_on_the_operators_pods_checks_each_kind_with_a_pod_template(child: ChildKind):
    spec = installed("ValidatingAdmissionPolicy", "cpullm-operator-pods")["spec"]
    rules = spec["matchConstraints"]["resourceRules"]
    assert any(child.group in r["apiGroups"] and child.plural in r["resources"] for r in rules), rules
