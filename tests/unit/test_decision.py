"""`decide`, the pure heart of a reconcile: Observed + a fixed `now` -> Decision. No stubs needed."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

import cpullm.core.decision as decision_module
from cpullm.api.plan import Plan
from cpullm.core.decision import Decision, Event, decide
from cpullm.core.observation import NamespaceFacts
from cpullm.core.pod_troubles import PodTrouble
from cpullm.errors import (
    ChildRejected,
    InvalidSpec,
    ModelConfigUnavailable,
    NoEligibleNode,
    PermissionDenied,
    PodSecurityForbidden,
)

from .builders import node, spec
from .support import T0, observed

T1 = datetime(2026, 1, 1, 12, 5, 0, tzinfo=UTC)
T0_TEXT, T1_TEXT = "2026-01-01T12:00:00Z", "2026-01-01T12:05:00Z"
NODES = (node("n1", numa=2, memory="512Gi"),)
BASELINE = NamespaceFacts(labels={"pod-security.kubernetes.io/enforce": "baseline"})
UNAVAILABLE = ModelConfigUnavailable("cannot reach the hub")


def kinds(decision: Decision) -> set[str]:
    return {child["kind"] for child in decision.children}


def conditions(status: Any) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


@pytest.mark.parametrize(
    ("fields", "reason", "message"),
    [
        pytest.param(
            {"spec": InvalidSpec("spec.replicas: bad"), "model": None, "namespace": BASELINE},
            "InvalidSpec",
            "spec.replicas: bad",
            id="invalid-spec-beats-baseline-namespace",
        ),
        pytest.param(
            {"namespace": BASELINE, "model": UNAVAILABLE, "nodes": ()},
            "PodSecurityForbidden",
            "namespace serving enforces Pod Security 'baseline'",
            id="pod-security-beats-unavailable-model",
        ),
        pytest.param(
            {"model": UNAVAILABLE, "nodes": ()},
            "ModelConfigUnavailable",
            "cannot reach the hub",
            id="unavailable-model-beats-no-eligible-node",
        ),
        pytest.param(
            {"nodes": ()},
            "NoEligibleNode",
            "no eligible node: no node the planner can read",
            id="no-eligible-node",
        ),
        pytest.param(
            {"nodes": (), "apply_error": ChildRejected("Deployment is invalid")},
            "NoEligibleNode",
            "no eligible node: no node the planner can read",
            id="plan-refusal-beats-apply-error",
        ),
        pytest.param(
            {"apply_error": ChildRejected("Deployment is invalid: env[0].name")},
            "ChildRejected",
            "Deployment is invalid: env[0].name",
            id="apply-error-replaces-good-plan",
        ),
        pytest.param(
            {"apply_error": PermissionDenied("forbidden to apply Deployment")},
            "PermissionDenied",
            "forbidden to apply Deployment",
            id="permission-denied-replaces-good-plan",
        ),
    ],
)
def test_refusal_order_most_fundamental_first(fields, reason, message):
    """Of several problems the one reported is the one the user must fix first; no children are built."""
    decision = decide(observed(**fields), T0)
    assert decision.outcome is not None and not isinstance(decision.outcome, Plan)
    assert (decision.outcome.reason, decision.children) == (reason, ())
    assert decision.outcome.message.startswith(message)
    assert conditions(decision.status) == {"Planned": ("False", reason), "Ready": ("False", reason)}
    planned = decision.status["conditions"][0]
    assert planned["message"] == decision.outcome.message
    assert "plan" not in decision.status  # no earlier plan to keep
    assert decision.events == (
        Event("Warning", reason, decision.outcome.message),
        Event("Warning", reason, f"not planned: {decision.outcome.message}"),
    )


def test_refusal_types_are_the_errors_observed():
    """The outcome is the very error observed (not a copy), so its extra fields (rejections) survive."""
    assert decide(observed(model=UNAVAILABLE), T0).outcome is UNAVAILABLE
    assert isinstance(decide(observed(namespace=BASELINE), T0).outcome, PodSecurityForbidden)
    refused = decide(observed(spec=spec(cpu={"requiredISA": ["sve"]})), T0).outcome
    assert isinstance(refused, NoEligibleNode) and refused.rejections == {"n1": "lacks ISA sve"}


def test_a_good_plan_builds_children_and_a_planned_status():
    decision = decide(observed(), T0)
    assert isinstance(decision.outcome, Plan) and decision.outcome.tensor_parallel_size == 2
    assert {"Deployment", "Service"} <= kinds(decision)
    assert all(child["metadata"]["ownerReferences"][0]["uid"] == "u1" for child in decision.children)
    assert decision.status["plan"] == decision.outcome.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert decision.status["selector"] == "cpullm.io/service=llama"
    assert decision.status["observedGeneration"] == 3
    assert decision.status_patch == decision.status  # nothing written yet: everything is new
    assert decision.events == (Event("Normal", "Planned", decision.outcome.summary),)  # not yet ready: no event


def test_a_refusal_keeps_the_last_good_plan_in_status():
    """The Deployment still runs the last plan: status.plan keeps saying so, and Ready says it was kept."""
    good = decide(observed(), T0)
    refused = decide(observed(nodes=(), status=good.status), T1)
    assert refused.status["plan"] == good.status["plan"]
    assert "plan" not in refused.status_patch
    ready = refused.status["conditions"][1]
    assert ready["message"].endswith("; the last applied Deployment is left as it was")


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({}, id="plannable"),
        pytest.param({"spec": InvalidSpec("bad"), "model": None}, id="invalid-spec"),
        pytest.param({"status": {"observedGeneration": 1, "conditions": []}}, id="with-old-status"),
    ],
)
def test_terminating_namespace_decides_nothing(fields):
    """Nothing may be created in a namespace being deleted, and there is nothing to report either."""
    decision = decide(observed(namespace=NamespaceFacts(terminating=True), **fields), T0)
    assert decision == Decision(outcome=None)
    assert (decision.children, dict(decision.status), dict(decision.status_patch), decision.events) == ((), {}, {}, ())


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({}, id="planned"),
        pytest.param({"deployment": {"status": {"replicas": 1, "readyReplicas": 1}}}, id="available"),
        pytest.param({"nodes": ()}, id="refused"),
        pytest.param({"spec": InvalidSpec("bad"), "model": None}, id="invalid-spec"),
    ],
)
def test_no_patch_and_no_event_when_status_is_already_as_decided(fields):
    """Reconciling again later with nothing new sends nothing (the clock moving is not a change)."""
    first = decide(observed(**fields), T0)
    again = decide(observed(status=first.status, **fields), T1)
    assert again.status == first.status
    assert (dict(again.status_patch), again.events) == ({}, ())


def test_ready_flipping_to_available_gives_one_normal_event_and_moves_only_its_transition_time():
    """Progressing -> Available: one event for Ready, none for Planned (it did not change)."""
    progressing = decide(observed(deployment={"status": {"replicas": 1, "readyReplicas": 0}}), T0)
    available = decide(
        observed(deployment={"status": {"replicas": 1, "readyReplicas": 1}}, status=progressing.status), T1
    )
    assert available.events == (Event("Normal", "Available", "1/1 replicas ready"),)
    assert set(available.status_patch) == {"readyReplicas", "conditions"}
    assert available.status_patch["readyReplicas"] == 1
    planned, ready = available.status["conditions"]
    assert (planned["type"], planned["lastTransitionTime"]) == ("Planned", T0_TEXT)  # kept: still True
    assert (ready["type"], ready["status"], ready["lastTransitionTime"]) == ("Ready", "True", T1_TEXT)


@pytest.mark.parametrize(
    ("before", "after", "events", "transition"),
    [
        pytest.param(
            {"deployment": {"status": {"replicas": 2, "readyReplicas": 0}}, "spec": spec(replicas=2)},
            {"deployment": {"status": {"replicas": 2, "readyReplicas": 1}}, "spec": spec(replicas=2)},
            (),
            T0_TEXT,
            id="progress-count-alone-is-no-event",
        ),
        pytest.param(
            {"deployment": {"status": {"replicas": 1, "readyReplicas": 1}}},
            {"deployment": {"status": {"replicas": 1, "readyReplicas": 0}}},
            (Event("Warning", "Progressing", "0/1 replicas ready"),),
            T1_TEXT,
            id="available-back-to-progressing",
        ),
        pytest.param(
            {"deployment": {"status": {"replicas": 1, "readyReplicas": 1}}},
            {"deployment": {"status": {"replicas": 0}}, "spec": spec(replicas=0)},
            (Event("Normal", "ScaledToZero", "no replicas requested"),),
            T0_TEXT,  # True -> True with another reason: not a transition
            id="available-to-scaled-to-zero",
        ),
    ],
)
def test_events_only_for_conditions_that_changed(before, after, events, transition):
    first = decide(observed(**before), T0)
    second = decide(observed(status=first.status, **after), T1)
    assert second.events == events
    assert second.status["conditions"][1]["lastTransitionTime"] == transition
    assert second.status["conditions"][0]["lastTransitionTime"] == T0_TEXT


def test_planned_flipping_to_false_moves_its_transition_time_and_warns():
    good = decide(observed(), T0)
    refused = decide(observed(model=UNAVAILABLE, status=good.status), T1)
    planned = refused.status["conditions"][0]
    assert (planned["status"], planned["reason"], planned["lastTransitionTime"]) == (
        "False",
        "ModelConfigUnavailable",
        T1_TEXT,
    )
    assert [(e.type, e.reason) for e in refused.events] == [
        ("Warning", "ModelConfigUnavailable"),
        ("Warning", "ModelConfigUnavailable"),
    ]


@pytest.mark.parametrize(
    ("deployment", "desired", "expected"),
    [
        pytest.param(None, 1, (0, 0, "False", "0/1 replicas ready"), id="no-deployment-yet"),
        pytest.param({}, 1, (0, 0, "False", "0/1 replicas ready"), id="deployment-without-status"),
        pytest.param({"status": {"replicas": 3}}, 3, (3, 0, "False", "0/3 replicas ready"), id="none-ready"),
        pytest.param(
            {"status": {"replicas": 3, "readyReplicas": 2}}, 3, (3, 2, "False", "2/3 replicas ready"), id="some"
        ),
        pytest.param(
            {"status": {"replicas": 4, "readyReplicas": 3}}, 3, (4, 3, "True", "3/3 replicas ready"), id="surge"
        ),
    ],
)
def test_replica_counts_come_from_the_deployment_status(deployment, desired, expected):
    decision = decide(observed(spec=spec(replicas=desired), deployment=deployment), T0)
    ready = decision.status["conditions"][1]
    status = decision.status
    assert (status["replicas"], status["readyReplicas"], ready["status"], ready["message"]) == expected


def test_desired_replicas_come_from_the_spec_not_the_raw_request():
    """requested_replicas is only the fallback for a spec that could not be parsed."""
    decision = decide(
        observed(spec=spec(replicas=2), requested_replicas=7, deployment={"status": {"readyReplicas": 2}}), T0
    )
    assert decision.status["conditions"][1]["message"] == "2/2 replicas ready"


@pytest.mark.parametrize(
    ("fields", "desired"),
    [
        pytest.param({"spec": InvalidSpec("bad"), "model": None, "requested_replicas": 5}, 5, id="invalid-spec"),
        pytest.param({"spec": spec(replicas=2), "requested_replicas": 5}, 2, id="valid-spec"),
    ],
)
def test_requested_replicas_are_the_desired_count_when_the_spec_is_invalid(fields, desired, monkeypatch):
    """A refusal's status does not show the desired count, so this checks what decide hands compute_status."""
    seen: list[int] = []
    real = decision_module.compute_status

    def spy(**kwargs: Any) -> dict[str, Any]:
        seen.append(kwargs["desired_replicas"])
        return real(**kwargs)

    monkeypatch.setattr(decision_module, "compute_status", spy)
    decide(observed(**fields), T0)
    assert seen == [desired]


def test_decide_is_pure():
    """The same observation at the same instant decides the same; the observation is not modified."""
    obs = observed(deployment={"status": {"replicas": 1, "readyReplicas": 1}})
    copy = replace(obs)
    assert decide(obs, T0) == decide(obs, T0)
    assert obs == copy


QUOTA = 'pods "llama-7d9f-abcde" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=0, limited: pods=0'
FAILED_CREATE = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": QUOTA}


@pytest.mark.parametrize(
    ("conditions", "trouble", "reason", "message"),
    [
        pytest.param(
            [FAILED_CREATE], None, "FailedCreate", f"0/1 replicas ready; pods cannot be created: {QUOTA}", id="quota"
        ),
        pytest.param(
            [FAILED_CREATE],
            PodTrouble("Unschedulable", "a pod cannot be scheduled: 0/3 nodes are available"),
            "FailedCreate",
            f"0/1 replicas ready; pods cannot be created: {QUOTA}",
            id="before-unschedulable",
        ),
        pytest.param(
            [{**FAILED_CREATE, "status": "False"}], None, "Progressing", "0/1 replicas ready", id="failure-cleared"
        ),
        pytest.param(
            [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"}],
            None,
            "Progressing",
            "0/1 replicas ready",
            id="other-conditions",
        ),
    ],
)
def test_pods_the_replica_set_cannot_create_are_the_ready_reason(conditions, trouble, reason, message):
    """A quota, an admission webhook or policy, an invalid image reference: the ReplicaSet's FailedCreate
    (the Deployment's ReplicaFailure condition) used to leave the service Progressing forever with no cause."""
    deployment = {"status": {"replicas": 0, "conditions": conditions}}
    decision = decide(observed(spec=spec(replicas=1), deployment=deployment, pod_trouble=trouble), T0)
    ready = decision.status["conditions"][1]
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", reason, message)
