from datetime import UTC, datetime

import pytest

from cpullm.core.planner import plan_service
from cpullm.core.pod_troubles import PodTrouble, pod_trouble
from cpullm.core.status import changed_conditions, compute_status, status_changes
from cpullm.errors import ModelTooLarge, NoEligibleNode

from .builders import llama_8b, node, spec

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 12, 5, 0, tzinfo=UTC)
PLAN = plan_service(spec(), llama_8b(), [node(numa=2, memory="512Gi")])


def status(outcome, desired=1, deployment=None, previous=None, now=T0, generation=3, trouble=None):
    return compute_status(
        name="svc",
        generation=generation,
        desired_replicas=desired,
        outcome=outcome,
        deployment_status=deployment,
        previous=previous or {},
        now=now,
        trouble=trouble,
    )


def conditions(result):
    return {c["type"]: (c["status"], c["reason"]) for c in result["conditions"]}


@pytest.mark.parametrize(
    ("outcome", "desired", "deployment", "expected"),
    [
        (
            PLAN,
            2,
            {"replicas": 2, "readyReplicas": 2},
            {"Planned": ("True", "Planned"), "Ready": ("True", "Available")},
        ),
        (
            PLAN,
            2,
            {"replicas": 2, "readyReplicas": 1},
            {"Planned": ("True", "Planned"), "Ready": ("False", "Progressing")},
        ),
        (PLAN, 2, None, {"Planned": ("True", "Planned"), "Ready": ("False", "Progressing")}),
        (PLAN, 0, {"replicas": 0}, {"Planned": ("True", "Planned"), "Ready": ("True", "ScaledToZero")}),
        (
            NoEligibleNode({"a": "lacks ISA amx_bf16"}),
            1,
            None,
            {"Planned": ("False", "NoEligibleNode"), "Ready": ("False", "NoEligibleNode")},
        ),
        (
            ModelTooLarge("too big"),
            1,
            {"replicas": 1, "readyReplicas": 1},
            {"Planned": ("False", "ModelTooLarge"), "Ready": ("False", "ModelTooLarge")},
        ),
    ],
)
def test_conditions(outcome, desired, deployment, expected):
    result = status(outcome, desired, deployment)
    assert conditions(result) == expected
    assert result["observedGeneration"] == 3
    assert all(
        c["observedGeneration"] == 3 and c["lastTransitionTime"] == "2026-01-01T12:00:00Z" for c in result["conditions"]
    )
    assert result["selector"] == "cpullm.io/service=svc"


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([], None),
        ([{"type": "PodScheduled", "status": "True"}], None),
        ([{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "gated"}], None),
        (
            [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes: cpu"}],
            "a pod cannot be scheduled: 0/2 nodes: cpu",
        ),
        (
            [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            "a pod cannot be scheduled: the scheduler found no node for it",
        ),
    ],
)
def test_scheduling_failure_is_the_schedulers_message(conditions, expected):
    found = pod_trouble({"conditions": conditions})
    assert (found.message if found else None) == expected


def test_an_unschedulable_pod_names_the_schedulers_reason_in_ready():
    message = "0/3 nodes are available: 3 Insufficient cpu."
    result = compute_status(
        name="svc",
        generation=3,
        desired_replicas=2,
        outcome=PLAN,
        deployment_status={"replicas": 2, "readyReplicas": 1},
        previous={},
        now=T0,
        trouble=PodTrouble("Unschedulable", f"a pod cannot be scheduled: {message}"),
    )
    ready = result["conditions"][1]
    assert (ready["status"], ready["reason"]) == ("False", "Unschedulable")
    assert ready["message"] == f"1/2 replicas ready; a pod cannot be scheduled: {message}"
    everything_ready = status(PLAN, 1, {"replicas": 1, "readyReplicas": 1})  # a surge pod pending: still Available
    assert conditions(everything_ready)["Ready"] == ("True", "Available")


def test_plan_is_reported_and_kept_when_a_later_plan_fails():
    planned = status(PLAN, deployment={"replicas": 1, "readyReplicas": 1})
    assert planned["plan"]["tensorParallelSize"] == 2 and "cpuManagerPolicy" not in planned["plan"]
    refused = status(ModelTooLarge("too big"), previous=planned, now=T1)
    assert refused["plan"] == planned["plan"]
    assert "last applied Deployment is left as it was" in refused["conditions"][1]["message"]


def test_transition_time_moves_only_when_the_status_flips():
    first = status(PLAN, deployment={"replicas": 1, "readyReplicas": 0})
    same = status(PLAN, deployment={"replicas": 1, "readyReplicas": 0}, previous=first, now=T1)
    assert same == first and status_changes(first, same) == {}
    flipped = status(PLAN, deployment={"replicas": 1, "readyReplicas": 1}, previous=first, now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in flipped["conditions"]}
    assert times == {"Planned": "2026-01-01T12:00:00Z", "Ready": "2026-01-01T12:05:00Z"}
    assert set(status_changes(first, flipped)) == {"readyReplicas", "conditions"}
    assert [c["type"] for c in changed_conditions(first, flipped)] == ["Ready"]


def test_progress_counts_alone_raise_no_event():
    one = status(PLAN, 3, {"replicas": 3, "readyReplicas": 1})
    two = status(PLAN, 3, {"replicas": 3, "readyReplicas": 2}, previous=one)
    assert changed_conditions(one, two) == []
    assert [c["type"] for c in changed_conditions({}, one)] == ["Planned"]  # a new service's rollout: Planned says it


def test_a_new_services_first_ready_is_an_event_unless_it_is_progressing():
    ready = status(PLAN, 1, {"replicas": 1, "readyReplicas": 1})
    assert [c["type"] for c in changed_conditions({}, ready)] == ["Planned", "Ready"]
    trouble = PodTrouble("Unschedulable", "a pod cannot be scheduled: 0/3 nodes are available: 3 Insufficient cpu.")
    unschedulable = status(PLAN, 1, {"replicas": 1}, trouble=trouble)
    assert [(c["type"], c["reason"]) for c in changed_conditions({}, unschedulable)] == [
        ("Planned", "Planned"),
        ("Ready", "Unschedulable"),
    ]


def test_a_key_the_new_status_no_longer_has_is_patched_away():
    """status is merge-patched: a plan's note that no longer applies must be sent as null, or it stays."""
    before = {"plan": {"cpu": 7, "placementNote": "left for DaemonSets", "nodeProfile": {"cpus": 7, "smt": True}}}
    after = {"plan": {"cpu": 8, "nodeProfile": {"cpus": 8}}, "readyReplicas": 1}
    assert status_changes(before, after) == {
        "plan": {"cpu": 8, "placementNote": None, "nodeProfile": {"cpus": 8, "smt": None}},
        "readyReplicas": 1,
    }
    assert status_changes(after, after) == {}
