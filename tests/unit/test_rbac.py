"""The chart grants what the operator does with each owned kind (core/children's CHILD_KINDS) and nothing is
granted twice for it; checked on manifests/install.yaml, the chart rendered with its defaults (e2e/test_chart.py
keeps the two equal)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cpullm.core.children import CHILD_KINDS, ChildKind

INSTALL = Path(__file__).resolve().parents[2] / "manifests" / "install.yaml"


def namespaced_rules() -> list[dict]:
    objects = [o for o in yaml.safe_load_all(INSTALL.read_text()) if o]
    (role,) = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "cpullm-operator"]
    return list(role["rules"])


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
