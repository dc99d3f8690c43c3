"""Rollout pacing: which template changes are the user's and which are paced (core/rollout.py), the decision that
leaves a paced Deployment as it is (core/decision.py), admission across threads (controller/pacing.py), and the
reconcile that asks for a slot before it writes (controller/reconcile.py)."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

from cpullm.controller.pacing import RolloutPacer
from cpullm.controller.reconcile import Reconciler
from cpullm.core.decision import decide
from cpullm.core.observation import ClusterView, NamespaceFacts, OperatorPolicy
from cpullm.core.rollout import (
    TEMPLATE_DIGEST,
    UNPACED_LABEL,
    RolloutCause,
    rollout_cause,
    rollout_finished,
    template_digest,
)
from cpullm.core.status import ROLLOUT_PACED

from .builders import node
from .support import T0, StubHub, StubKube, observed, service

DESIRED = {"metadata": {"annotations": {TEMPLATE_DIGEST: "new"}}}


def live(digest: str | None = "old", generation: int = 1, want: int = 1, **status: Any) -> dict[str, Any]:
    annotations = {TEMPLATE_DIGEST: digest} if digest else {}
    return {
        "metadata": {"generation": generation, "annotations": annotations},
        "spec": {"replicas": want},
        "status": status,
    }


@pytest.mark.parametrize(
    ("deployment", "generation", "observed_generation", "cause"),
    [
        pytest.param(None, 1, None, None, id="no Deployment yet: a create restarts nothing"),
        pytest.param(live("new"), 3, 3, None, id="the same template"),
        pytest.param(live("old"), 3, 2, RolloutCause.SPEC, id="the spec changed since the last reconcile"),
        pytest.param(live("old"), 3, 3, RolloutCause.BACKGROUND, id="same spec, another template: paced"),
        pytest.param(live(None), 3, 3, RolloutCause.BACKGROUND, id="written before digests: counted as changed"),
    ],
)
def test_rollout_cause(deployment, generation, observed_generation, cause):
    assert rollout_cause(deployment, DESIRED, generation, observed_generation) is cause


@pytest.mark.parametrize(
    ("deployment", "finished"),
    [
        pytest.param(
            live(generation=2, observedGeneration=2, updatedReplicas=1, availableReplicas=1, replicas=1),
            True,
            id="done",
        ),
        pytest.param(
            live(generation=3, observedGeneration=2, updatedReplicas=1, availableReplicas=1, replicas=1),
            False,
            id="the controller has not seen the new template",
        ),
        pytest.param(
            live(generation=2, observedGeneration=2, updatedReplicas=1, availableReplicas=0, replicas=1),
            False,
            id="the new pod is not available yet",
        ),
        pytest.param(live(generation=2, observedGeneration=2), False, id="no pod counted in status yet"),
        pytest.param(
            live(generation=2, want=2) | {"status": {"observedGeneration": 2, "updatedReplicas": 1, "replicas": 2}},
            False,
            id="an old pod is left",
        ),
        pytest.param(live(generation=2, want=0, observedGeneration=2), True, id="scaled to zero"),
        pytest.param(
            live(generation=2, observedGeneration=2)
            | {
                "status": {
                    "observedGeneration": 2,
                    "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}],
                }
            },
            True,
            id="given up: its progress deadline passed",
        ),
    ],
)
def test_rollout_finished(deployment, finished):
    assert rollout_finished(deployment) is finished


def test_the_pacer_admits_at_most_its_limit_and_wakes_the_line_in_order_as_rollouts_finish():
    pacer = RolloutPacer(2)
    a, b, c, d = (("ns", n) for n in "abcd")
    assert pacer.admit(a) and pacer.admit(b)
    assert not pacer.anyone_waiting()
    assert not pacer.admit(c) and not pacer.admit(d)
    assert pacer.anyone_waiting() and pacer.waiting(c) and not pacer.waiting(a)
    assert pacer.admit(a)  # a second change of a service already rolling: its slot
    assert pacer.to_wake() == []
    pacer.started(a, 5)
    pacer.started(b, 7)
    pacer.observe(a, live(generation=5, observedGeneration=4, updatedReplicas=1, availableReplicas=1, replicas=1))
    assert pacer.to_wake() == []  # still on the old template
    pacer.observe(a, live(generation=5, observedGeneration=5, updatedReplicas=1, availableReplicas=1, replicas=1))
    assert pacer.to_wake() == [c]
    assert pacer.to_wake() == []  # handed back once until its reconcile answers
    assert pacer.admit(c)
    pacer.observe(b, None)  # deleted
    assert pacer.to_wake() == [d]


def test_a_reconcile_that_needs_no_slot_leaves_the_line_and_frees_one_never_written():
    pacer = RolloutPacer(1)
    a, b = ("ns", "a"), ("ns", "b")
    assert pacer.admit(a) and not pacer.admit(b)
    pacer.settled(a)  # admitted, never written: free again
    pacer.settled(b)  # its reconcile needed no slot after all: out of line
    assert not pacer.anyone_waiting() and pacer.admit(b)


def test_a_namespace_holds_at_most_its_share_while_others_wait_and_all_of_them_alone():
    """Slots shared by namespace: a namespace alone takes every slot; once another waits, the freed slots go to the
    namespace below its share, whatever the order of the line."""
    pacer = RolloutPacer(4)
    busy = [("a", str(i)) for i in range(4)]
    assert all(pacer.admit(key) for key in busy)  # namespace a alone: all four
    for key in busy:
        pacer.started(key, 1)
    later_a, first_b, second_b = ("a", "x"), ("b", "1"), ("b", "2")
    assert not pacer.admit(later_a) and not pacer.admit(first_b) and not pacer.admit(second_b)
    for key in busy[:2]:
        pacer.observe(key, None)
    assert pacer.to_wake() == [first_b, second_b]  # b below its share of 2; a, at 2, is not
    assert pacer.admit(first_b) and pacer.admit(second_b)
    pacer.observe(busy[2], None)
    assert pacer.to_wake() == [later_a]  # a holds 1, below its share again
    assert pacer.admit(later_a)


def test_one_namespace_cannot_take_a_freed_slot_past_its_share_by_asking_first():
    pacer = RolloutPacer(2)
    assert pacer.admit(("a", "1")) and pacer.admit(("a", "2"))
    pacer.started(("a", "1"), 1)
    assert not pacer.admit(("b", "1"))  # full: b waits
    pacer.observe(("a", "1"), None)
    assert not pacer.admit(("a", "3"))  # a holds its share (2 slots, 2 namespaces): the slot is b's
    assert pacer.to_wake() == [("b", "1")] and pacer.admit(("b", "1"))


def test_no_limit_admits_everything():
    pacer = RolloutPacer(None)
    assert all(pacer.admit(("ns", str(i))) for i in range(100))
    assert pacer.to_wake() == []


def test_admission_is_atomic_across_threads():
    pacer = RolloutPacer(3)
    start, admitted = threading.Barrier(16), []

    def ask(i: int) -> None:
        start.wait()
        if pacer.admit(("ns", str(i))):
            admitted.append(i)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(admitted) == 3


def names(children: Any) -> set[tuple[str, str]]:
    return {(c["kind"], c["metadata"]["name"]) for c in children}


def servers_of(decision: Any) -> dict[str, Any] | None:
    return next((c for c in decision.children if c["kind"] == "Deployment" and c["metadata"]["name"] == "llama"), None)


def test_a_held_background_rollout_leaves_the_deployment_out_and_says_why():
    first = decide(observed(), T0)
    servers = servers_of(first)
    assert servers is not None
    running = live("an older template", generation=1)
    background = observed(
        deployment=running, status={"observedGeneration": 3}, policy=OperatorPolicy(max_concurrent_rollouts=2)
    )
    assert decide(background, T0).paced_rollout
    held = decide(replace(background, rollout_held=True), T0)
    assert servers_of(held) is None and not held.paced_rollout
    assert names(held.children) == names(first.children) - {("Deployment", "llama")}
    paced = next(c for c in held.status["conditions"] if c["type"] == ROLLOUT_PACED)
    assert (paced["status"], paced["reason"]) == ("True", ROLLOUT_PACED)
    assert "at most 2 services" in paced["message"]
    assert [(e.type, e.reason) for e in held.events if e.reason == ROLLOUT_PACED] == [("Normal", ROLLOUT_PACED)]


@pytest.mark.parametrize(
    ("fields", "paced"),
    [
        pytest.param({"status": {"observedGeneration": 2}}, False, id="the user's own spec change"),
        pytest.param({"status": {"observedGeneration": 3}, "deployment": None}, False, id="no Deployment yet"),
        # An administrator let the namespace's rollouts through (tenants cannot label their Namespace).
        pytest.param(
            {"status": {"observedGeneration": 3}, "namespace": NamespaceFacts(labels={UNPACED_LABEL: "true"})},
            False,
            id="a namespace labelled unpaced",
        ),
        pytest.param(
            {"status": {"observedGeneration": 3}, "namespace": NamespaceFacts(labels={UNPACED_LABEL: "yes"})},
            True,
            id="only the label's value true lets it through",
        ),
    ],
)
def test_what_is_never_paced(fields, paced):
    running = live("an older template", generation=1)
    unheld = decide(observed(**{"deployment": running, **fields}), T0)
    assert unheld.paced_rollout is paced
    held = decide(observed(**{"deployment": running, "rollout_held": True, **fields}), T0)
    assert (servers_of(held) is not None) is not paced  # held back only where paced


def test_the_same_template_needs_no_slot():
    desired = servers_of(decide(observed(), T0))
    assert desired is not None
    digest = desired["metadata"]["annotations"][TEMPLATE_DIGEST]
    assert digest == template_digest(desired["spec"]["template"])
    same = observed(deployment=live(digest), status={"observedGeneration": 3}, rollout_held=True)
    decision = decide(same, T0)
    assert not decision.paced_rollout and servers_of(decision) is not None


def test_the_reconcile_writes_a_background_rollout_only_with_a_slot_and_frees_it_when_it_finished():
    kube = StubKube()
    reconciler = Reconciler(kube, StubHub(), policy=OperatorPolicy(max_concurrent_rollouts=1))
    svc = service({}, status=None)
    svc["status"] = {"observedGeneration": svc["metadata"]["generation"]}
    running = live("an older template", generation=1)
    other = ("serving", "other")

    assert reconciler.pacer.admit(other)  # the one slot is another service's
    reconciler.pacer.started(other, 1)
    reconciler.reconcile(svc, ClusterView(nodes=[node_8b()], deployment=running))
    assert [c["kind"] for c in kube.applied if c["metadata"]["name"] == "llama" and c["kind"] == "Deployment"] == []
    assert ("Normal", ROLLOUT_PACED) in kube.events
    reconciler.pacer.observe(other, None)  # its rollout is over
    assert reconciler.pacer.to_wake() == [("serving", "llama")]

    kube.applied.clear()
    reconciler.reconcile(svc, ClusterView(nodes=[node_8b()], deployment=running))
    written = [c for c in kube.applied if c["kind"] == "Deployment" and c["metadata"]["name"] == "llama"]
    assert len(written) == 1
    assert not reconciler.pacer.admit(other)  # the slot is taken until the rollout is seen finished
    reconciler.pacer.observe(("serving", "llama"), None)
    assert reconciler.pacer.admit(other)


def node_8b() -> Any:
    return node("n1", numa=2, memory="512Gi")
