"""The reconcile path with the one API module stubbed (tests against a real API server live in e2e/)."""

import itertools
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from cpullm.controller.dispatch import find_drifted
from cpullm.controller.outcomes import retry_delay
from cpullm.controller.reconcile import Reconciler
from cpullm.core.observation import ChildSeen, ClusterView, OperatorPolicy, Ownership
from cpullm.errors import (
    ChildConflict,
    ChildExists,
    ModelConfigUnavailable,
    NoEligibleNode,
    PermissionDenied,
    TransientApiError,
)
from cpullm.io.hub import HubClient

from .builders import LLAMA_8B, node
from .support import StubHub, StubKube, service, state_of


def reconciler(hub: StubHub | None = None) -> tuple[Reconciler, StubKube]:
    kube = StubKube()
    return Reconciler(kube, hub or StubHub(), clock=lambda: datetime(2026, 1, 1, tzinfo=UTC)), kube


NODES = [node("n1", numa=2, memory="512Gi")]
# The owned Deployment as Kopf's index holds it: one replica, ready.
READY = {"status": {"replicas": 1, "readyReplicas": 1}}


def test_reconcile_applies_children_patches_status_once_and_is_idempotent():
    rec, kube = reconciler()
    outcome = rec.reconcile(service({"hfTokenSecret": {"name": "hf"}}), ClusterView(nodes=NODES, deployment=READY))
    assert outcome.tensor_parallel_size == 2
    assert [m["kind"] for m in kube.applied] == ["NetworkPolicy", "ConfigMap", "Service", "Deployment"]
    assert rec.hub.calls == [("meta-llama/Llama-3.1-8B", None, "hf_secret")]
    (patch,) = kube.status_patches
    assert patch["readyReplicas"] == 1 and patch["observedGeneration"] == 2
    assert kube.events == [("Normal", "Planned"), ("Normal", "Available")]

    rec.reconcile(service({"hfTokenSecret": {"name": "hf"}}, status=patch), ClusterView(nodes=NODES, deployment=READY))
    assert len(kube.status_patches) == 1 and len(kube.events) == 2  # nothing changed: no patch, no event
    assert len(kube.applied) == 4  # the children did not change and nobody touched them: no second write


def test_a_source_shared_by_namespace_is_asked_as_the_services_namespace():
    """The Hub client shares its header readers by namespace (io/hub.py): a reconcile asks it as its service's."""

    class SharedHub(StubHub):
        def in_namespace(self, namespace: str) -> StubHub:
            self.calls.append(("in_namespace", namespace, None))
            return self

    rec, _ = reconciler(SharedHub())
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert rec.hub.calls == [("in_namespace", "serving", None), ("meta-llama/Llama-3.1-8B", None, None)]


def test_a_stored_spec_with_a_newer_crds_default_is_planned_as_without_it():
    """While an upgrade rolls, the new CRD is applied first and the API server shows its defaults in every stored
    spec, fields an operator of the version before does not know: it plans the spec without them, where before it
    reported every such service InvalidSpec ("no such field") until the new operator ran."""
    rec, kube = reconciler()
    newer = {"hfTokenSecret": {"name": "hf", "rotateEvery": "24h"}, "model": {"name": "meta-llama/Llama-3.1-8B"}}
    outcome = rec.reconcile(service(newer), ClusterView(nodes=NODES, deployment=READY))
    assert outcome.tensor_parallel_size == 2, outcome  # type: ignore[union-attr]
    assert [m["kind"] for m in kube.applied] == ["NetworkPolicy", "ConfigMap", "Service", "Deployment"]


@pytest.mark.parametrize(
    ("controller", "adopted"),
    [(None, False), ("someone-else", False), ("u1", True)],
    ids=["unowned", "another-controller", "its-own"],
)
def test_a_child_name_taken_by_someone_else_is_a_conflict_and_nothing_is_touched(controller, adopted):
    """A same-name Service made by someone else is neither adopted nor changed, found by the create that it refuses
    and read only then; the servers are not written (what came before them is the service's own); the service's
    own Service (a restart of the operator) is written over as read."""
    rec, kube = reconciler()
    kube.owners[("Service", "serving", "llama")] = Ownership(uid="s1", controller_uid=controller, resource_version="3")
    outcome = rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert kube.ownership_reads == [("Service", "serving", "llama")]
    if adopted:
        assert [m["kind"] for m in kube.applied] == ["NetworkPolicy", "ConfigMap", "Service", "Deployment"]
        assert kube.applied_over[2] == kube.owners[("Service", "serving", "llama")]
        return
    assert isinstance(outcome, ChildConflict) and [m["kind"] for m in kube.applied] == ["NetworkPolicy", "ConfigMap"]
    planned = kube.status_patches[0]["conditions"][0]
    assert (planned["reason"], planned["status"]) == ("Conflict", "False")
    assert planned["message"].startswith("Service serving/llama exists and is not controlled by this CpuLLMService")


def test_refusal_becomes_condition_and_warning_event_not_an_exception():
    rec, kube = reconciler()
    outcome = rec.reconcile(service({"cpu": {"requiredISA": ["sve"]}}), ClusterView(nodes=NODES))
    assert isinstance(outcome, NoEligibleNode)
    assert kube.applied == []
    assert kube.events == [("Warning", "NoEligibleNode"), ("Warning", "NoEligibleNode")]
    assert kube.status_patches[0]["conditions"][0]["message"].startswith("no eligible node: lacks ISA sve")
    assert retry_delay(outcome, 0) is None  # a refusal waits for a change of the spec or the nodes


def test_invalid_spec_is_reported():
    rec, kube = reconciler()
    outcome = rec.reconcile(service({"replicas": -1}), ClusterView(nodes=NODES))
    assert outcome.reason == "InvalidSpec" and "spec.replicas" in outcome.message
    assert kube.status_patches[0]["conditions"][0]["reason"] == "InvalidSpec"


@pytest.mark.parametrize(
    ("spec", "hub", "message"),
    [
        ({}, StubHub(fail=True), "cannot reach the hub"),
        ({"hfTokenSecret": {"name": "missing"}}, StubHub(), "has no key HF_TOKEN"),
        # The real Hub client: it refuses a path before any request (nothing listens on port 9).
        (
            {"model": {"name": "/models/llama"}},
            HubClient("http://127.0.0.1:9", allow_http=True),
            "give spec.model.config",
        ),
    ],
)
def test_unavailable_model_config_is_reported_and_retried_with_backoff(spec, hub, message):
    rec, kube = reconciler(hub)
    outcome = rec.reconcile(service(spec), ClusterView(nodes=NODES))
    assert isinstance(outcome, ModelConfigUnavailable) and message in outcome.message
    assert kube.status_patches[0]["conditions"][0]["reason"] == "ModelConfigUnavailable"
    assert retry_delay(outcome, 3) == 80


def test_inline_config_needs_no_hub():
    rec, _ = reconciler(StubHub(fail=True))
    assert (
        rec.reconcile(
            service({"model": {"name": "/models/llama", "config": LLAMA_8B}}), ClusterView(nodes=NODES)
        ).tensor_parallel_size
        == 2
    )


@pytest.mark.parametrize(
    ("level", "spec", "refused"),
    [
        ("privileged", {}, None),
        ("baseline", {}, "set spec.numaPrivileges: false"),
        ("baseline", {"numaPrivileges": False}, None),
        ("baseline", {"numaPrivileges": False, "seccompProfile": "Unconfined"}, "seccompProfile: RuntimeDefault"),
        ("restricted", {"numaPrivileges": False}, None),
        ("restricted", {}, "numaSeccomp.enabled"),
    ],
)
def test_pod_security_level_that_would_reject_the_pod_is_a_refusal(level, spec, refused):
    rec, kube = reconciler()
    kube.namespace_labels = {"pod-security.kubernetes.io/enforce": level}
    outcome = rec.reconcile(service(spec), ClusterView(nodes=NODES))
    if refused is None:
        assert outcome.tensor_parallel_size == 2
    else:
        assert outcome.reason == "PodSecurityForbidden" and refused in outcome.message
        assert "pod-security.kubernetes.io/enforce=privileged" in outcome.message
        assert kube.applied == [] and ("Warning", "PodSecurityForbidden") in kube.events


def test_with_the_administrators_numa_profile_a_restricted_namespace_runs_servers_under_it():
    """The operator's setting (settings.numa_seccomp_profile) reaches the rendered pod through the reconcile."""
    kube = StubKube()
    policy = OperatorPolicy(numa_seccomp_profile="cpullm/numa.json")
    rec = Reconciler(kube, StubHub(), clock=lambda: datetime(2026, 1, 1, tzinfo=UTC), policy=policy)
    kube.namespace_labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    outcome = rec.reconcile(service({}), ClusterView(nodes=NODES))
    assert outcome.security.localhost_profile == "cpullm/numa.json" and outcome.security.run_as_user is not None
    (deployment,) = [c for c in kube.applied if c["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "cpullm/numa.json",
    }


def test_terminating_namespace_is_left_alone():
    rec, kube = reconciler()
    kube.terminating = True
    assert rec.reconcile(service({}), ClusterView(nodes=NODES)) is None
    assert (kube.applied, kube.status_patches, kube.events) == ([], [], [])


def test_a_stale_snapshot_after_our_own_status_write_causes_no_repeat():
    rec, kube = reconciler()
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    rec.reconcile(
        service({}), ClusterView(nodes=NODES, deployment=READY)
    )  # the watch has not delivered our status yet: same stale body
    assert len(kube.status_patches) == 1 and kube.events == [("Normal", "Planned"), ("Normal", "Available")]


def test_forbidden_apply_is_reported_even_when_reads_are_forbidden_too():
    rec, kube = reconciler()

    def forbidden(*_args):
        raise PermissionDenied("forbidden to apply Deployment serving/llama: no rule")

    kube.apply = forbidden
    outcome = rec.reconcile(service({}), ClusterView(nodes=NODES))
    assert isinstance(outcome, PermissionDenied)
    assert kube.status_patches[0]["conditions"][0]["reason"] == "PermissionDenied"
    assert retry_delay(outcome, 0) == 10


def test_a_child_the_watches_show_controlled_by_the_service_is_written_over_without_a_read():
    """The first writes are creates, with no read; after a restart (nothing applied by this process yet) every child
    is written again: over what the watches show, carrying their resourceVersion, with no read; a child they show
    controlled by another object is read, and refused before anything is written, as any object the service does
    not control."""
    rec, kube = reconciler()
    rec.reconcile(service({}), ClusterView(nodes=NODES))
    created = [(m["kind"], m["metadata"]["namespace"], m["metadata"]["name"]) for m in kube.applied]
    assert kube.ownership_reads == [] and kube.applied_over == [None] * len(created)
    watched = [ChildSeen(kind, ns, name, Ownership(f"uid-{name}", "u1", "7")) for kind, ns, name in created]

    restarted = Reconciler(kube, StubHub(), clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    kube.applied.clear(), kube.applied_over.clear(), kube.ownership_reads.clear()
    restarted.reconcile(service({}), ClusterView(nodes=NODES, children=watched))
    assert kube.ownership_reads == []
    assert [over.resource_version for over in kube.applied_over if over] == ["7"] * len(created)

    again = Reconciler(kube, StubHub(), clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    kube.applied.clear(), kube.ownership_reads.clear()
    deployment = next(c for c in watched if c.kind == "Deployment")
    theirs = replace(deployment, ownership=replace(deployment.ownership, controller_uid="someone-else"))
    kube.owners[("Deployment", theirs.namespace, theirs.name)] = Ownership(theirs.ownership.uid, "someone-else", "8")
    others = [c for c in watched if c.kind != "Deployment"]
    again.reconcile(service({}), ClusterView(nodes=NODES, children=[*others, theirs]))
    assert kube.ownership_reads == [("Deployment", theirs.namespace, theirs.name)]  # read: not the service's
    assert kube.applied == []  # refused before anything is written
    assert "exists and is not controlled by this CpuLLMService" in str(kube.status_patches[-1])


def test_a_child_of_a_kind_not_watched_that_the_status_lists_is_read_then_written_over():
    """After a restart, the NetworkPolicy (a kind the watches do not show) that status.optionalChildren lists as
    written is read and written over as read: one read, where a create would be refused before it."""
    rec, kube = reconciler()
    rec.reconcile(service({}), ClusterView(nodes=NODES))
    listed = kube.status_patches[-1]["optionalChildren"]
    policy = next(m for m in kube.applied if m["kind"] == "NetworkPolicy")
    key = ("NetworkPolicy", "serving", policy["metadata"]["name"])
    kube.owners[key] = Ownership("np-1", "u1", "5")
    restarted = Reconciler(kube, StubHub(), clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    kube.applied.clear(), kube.applied_over.clear()
    restarted.reconcile(service({}, status={"optionalChildren": listed}), ClusterView(nodes=NODES))
    assert kube.ownership_reads == [key]
    assert kube.applied[0]["kind"] == "NetworkPolicy" and kube.applied_over[0] == kube.owners[key]


def test_forgetting_a_deleted_service_releases_its_memory():
    rec, kube = reconciler()
    rec.reconcile(service({}), ClusterView(nodes=NODES))
    rec.reconcile(service({}), ClusterView(nodes=NODES))  # the stale body is compared with what was written: no patch
    assert len(kube.status_patches) == 1
    state_of(rec).forget("serving", "llama", "u1")
    rec.reconcile(
        service({}), ClusterView(nodes=NODES)
    )  # forgotten: the object's own (empty) status is the reference again
    assert len(kube.status_patches) == 2


def test_children_are_applied_again_only_when_they_or_someone_elses_edits_changed():
    """A no-op server-side apply is still a write: a child is re-applied when its desired manifest changed or
    its watch shows someone else's change (a Deployment's generation, another kind's resourceVersion), never
    for a Deployment's status updates."""
    rec, kube = reconciler()
    kube.apply = lambda manifest, over: (
        kube.applied.append(manifest)
        or {
            **manifest,
            "metadata": {**manifest["metadata"], "generation": 1, "resourceVersion": "10"},
        }
    )
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert [m["kind"] for m in kube.applied] == ["NetworkPolicy", "ConfigMap", "Service", "Deployment"]
    status_only = {"metadata": {"name": "llama", "generation": 1, "resourceVersion": "11"}}
    rec.memory.child_event("Deployment", "serving", "llama", "MODIFIED", status_only, "llama")
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert len(kube.applied) == 4
    assert rec.memory.child_event(
        "Deployment", "serving", "llama", "MODIFIED", {"metadata": {"generation": 2}}, "llama"
    )
    assert rec.memory.child_event("ConfigMap", "serving", "llama-launcher", "DELETED", {"metadata": {}}, "llama")
    assert rec.memory.child_event(
        "Service", "serving", "llama", "MODIFIED", {"metadata": {"resourceVersion": "12"}}, "llama"
    )
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert [m["kind"] for m in kube.applied[4:]] == ["ConfigMap", "Service", "Deployment"]
    rec.reconcile(
        service({"kvCacheGiB": 8}), ClusterView(nodes=NODES, deployment=READY)
    )  # the desired Deployment changed
    assert [m["kind"] for m in kube.applied[7:]] == ["Deployment"]


def test_namespace_facts_are_read_once_per_ttl():
    now = [100.0]
    kube = StubKube()
    reads: list[str] = []
    read = kube.read_namespace
    kube.read_namespace = lambda ns: reads.append(ns) or read(ns)
    rec = Reconciler(kube, StubHub(), namespace_cache_seconds=10, monotonic=lambda: now[0])
    for _ in range(3):
        rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert reads == ["serving"]
    now[0] += 10.5
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert reads == ["serving", "serving"]


def test_a_deleted_service_drops_its_namespaces_facts():
    """A namespace deleted (its services with it) and made again under its name within the TTL is read anew: its
    UID keys the node cache directories, and the last namespace's must not serve the new one's services."""
    kube = StubKube()
    reads: list[str] = []
    read = kube.read_namespace
    kube.read_namespace = lambda ns: reads.append(ns) or read(ns)
    rec = Reconciler(kube, StubHub(), namespace_cache_seconds=10, monotonic=lambda: 100.0)
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    state_of(rec).forget("serving", "llama", "u1")
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert reads == ["serving", "serving"]


def applied_with_markers(kube: StubKube) -> None:
    """The API server's answer to an apply: what was applied, with resourceVersion 10, and generation 1 for a
    Deployment (ConfigMaps and Services have none)."""

    def apply(manifest: dict[str, Any], over: Ownership | None) -> dict[str, Any]:
        kube.applied.append(manifest)
        generation = {"generation": 1} if manifest["kind"] == "Deployment" else {}
        return {**manifest, "metadata": {**manifest["metadata"], **generation, "resourceVersion": "10"}}

    kube.apply = apply


STARTING = {"metadata": {"name": "llama", "generation": 1}, "status": {"replicas": 1, "readyReplicas": 0}}
ROLLED_OUT = {**STARTING, "status": {**STARTING["status"], "updatedReplicas": 1}}  # counts as before


@pytest.mark.parametrize(
    ("kind", "name", "event", "body", "needed"),
    [
        ("Deployment", "llama", "ADDED", STARTING, False),  # the operator's own apply, as it read it
        ("Deployment", "llama", "MODIFIED", {**STARTING, "status": {"replicas": 2, "readyReplicas": 0}}, True),
        ("Deployment", "llama", "MODIFIED", ROLLED_OUT, False),
        ("Deployment", "llama", "MODIFIED", {**STARTING, "status": {"replicas": 1, "readyReplicas": 1}}, True),
        ("Deployment", "llama", "MODIFIED", {**STARTING, "metadata": {"generation": 2}}, True),  # someone's edit
        ("Deployment", "llama", "DELETED", STARTING, True),
        ("Service", "llama", "ADDED", {"metadata": {"resourceVersion": "10"}}, False),
        ("Service", "llama", "MODIFIED", {"metadata": {"resourceVersion": "12"}}, True),
        ("ConfigMap", "llama-launcher", "MODIFIED", {"metadata": {"resourceVersion": "10"}}, False),
        ("ConfigMap", "llama-launcher", "DELETED", {"metadata": {"resourceVersion": "10"}}, True),
        ("ConfigMap", "other-launcher", "ADDED", {"metadata": {"resourceVersion": "3"}}, True),  # not applied here
        # Kopf's re-listing after a watch failed: only what changed while the watch was down
        ("Deployment", "llama", None, STARTING, False),
        ("Deployment", "llama", None, {**STARTING, "status": {"replicas": 1, "readyReplicas": 1}}, True),
        ("Deployment", "llama", None, {**STARTING, "metadata": {"generation": 2}}, True),
        ("Service", "llama", None, {"metadata": {"resourceVersion": "10"}}, False),
        ("ConfigMap", "other-launcher", None, {"metadata": {"resourceVersion": "3"}}, False),
    ],
)
def test_a_child_event_asks_for_a_reconcile_only_when_it_can_change_the_children_or_status(
    kind, name, event, body, needed
):
    """What the service's latest reconcile read (a Deployment with 0/1 replicas ready) and applied (its own
    writes, answered with generation 1, resourceVersion 10) asks for nothing more."""
    rec, kube = reconciler()
    applied_with_markers(kube)
    rec.reconcile(
        service({}), ClusterView(nodes=NODES, deployment=STARTING), ticket=rec.memory.begin(service({}), STARTING)
    )
    assert rec.memory.child_event(kind, "serving", name, event, body, "llama") is needed


def test_child_events_before_any_reconcile_ask_for_one_unless_in_the_operators_first_listing():
    rec, _ = reconciler()
    assert rec.memory.child_event("Deployment", "serving", "llama", "ADDED", STARTING, "llama")
    assert not rec.memory.child_event("Deployment", "serving", "llama", None, STARTING, "llama")


def test_a_reconcile_that_read_older_facts_than_a_later_one_is_superseded():
    """Two reconciles of one service read their facts in order (begin); the older, run second, would report its
    older Deployment counts over the newer's. It does nothing; so does one of a service deleted meanwhile."""
    rec, kube = reconciler()
    older = rec.memory.begin(service({}), None)
    newer = rec.memory.begin(service({}), READY)
    assert rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY), ticket=newer) is not None
    patches, applied = len(kube.status_patches), len(kube.applied)
    assert rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=None), ticket=older) is None
    assert (len(kube.status_patches), len(kube.applied)) == (patches, applied)
    assert kube.status_patches[-1]["readyReplicas"] == 1
    pending = rec.memory.begin(service({}), READY)
    state_of(rec).forget("serving", "llama", "u1")
    assert rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY), ticket=pending) is None
    assert len(kube.applied) == applied


def test_children_deleted_unseen_are_found_by_a_listing_and_applied_again():
    rec, kube = reconciler()
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    kube.present = {("serving", "llama")}  # the launcher ConfigMap "llama-launcher" is gone
    assert find_drifted(state_of(rec), "Deployment", []) == []
    assert find_drifted(state_of(rec), "ConfigMap", []) == [("serving", "llama")]  # its owner, the service
    assert kube.reads == [("ConfigMap", "serving", "llama-launcher")]  # only what the listing missed is read
    assert find_drifted(state_of(rec), "ConfigMap", []) == []  # forgotten: reported once
    del kube.applied[:]
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert [m["kind"] for m in kube.applied] == ["ConfigMap"]


def test_a_child_another_writer_changed_is_found_by_a_listing_and_applied_again():
    """What the kinds that are not watched (an InferencePool, a PodDisruptionBudget) rely on: no event tells."""
    rec, kube = reconciler()
    rec.reconcile(service({"replicas": 2}), ClusterView(nodes=NODES, deployment=READY))
    kube.present = {("serving", "llama"), ("serving", "llama-launcher")}
    kube.changed = {("serving", "llama")}
    assert find_drifted(state_of(rec), "PodDisruptionBudget", []) == [("serving", "llama")]
    assert kube.reads == []  # listed, so not read
    assert find_drifted(state_of(rec), "PodDisruptionBudget", []) == []  # forgotten: reported once
    del kube.applied[:]
    rec.reconcile(service({"replicas": 2}), ClusterView(nodes=NODES, deployment=READY))
    assert [m["kind"] for m in kube.applied] == ["PodDisruptionBudget"]


def test_a_child_applied_while_the_listing_ran_is_not_taken_for_deleted():
    rec, kube = reconciler()
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    kube.list_owned = lambda kind, namespaces: (
        rec.reconcile(service({"kvCacheGiB": 8}), ClusterView(nodes=NODES, deployment=READY)) and {}
    )
    assert find_drifted(state_of(rec), "Deployment", []) == []


def test_a_child_a_listing_misses_but_a_read_finds_is_not_taken_for_deleted():
    rec, kube = reconciler()
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    kube.unlisted = {("serving", "llama")}
    assert [find_drifted(state_of(rec), kind, []) for kind in ("Deployment", "Service")] == [[], []]
    assert [kind for kind, _, _ in kube.reads] == ["Deployment", "Service"]
    del kube.applied[:]
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    assert kube.applied == []  # still known to match: nothing applied again


def test_a_child_applied_again_while_it_was_read_is_not_taken_for_deleted():
    rec, kube = reconciler()
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))

    def applied_meanwhile(kind, namespace, name):
        rec.reconcile(service({"kvCacheGiB": 8}), ClusterView(nodes=NODES, deployment=READY))
        return False

    kube.child_exists = applied_meanwhile
    assert find_drifted(state_of(rec), "Deployment", []) == []


def test_a_forgotten_service_leaves_no_children_to_look_for():
    rec, _ = reconciler()
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=READY))
    state_of(rec).forget("serving", "llama", "u1")
    assert [find_drifted(state_of(rec), kind, []) for kind in ("Deployment", "Service", "ConfigMap")] == [[], [], []]


def test_a_service_event_asks_for_a_reconcile_only_for_a_spec_no_reconcile_read():
    """The operator's own status patches (same generation) ask for nothing; a new generation, another object
    under the same name, or a service this process never reconciled (its first listing) do."""
    rec, _ = reconciler()
    first = service({})
    assert rec.memory.service_event(first)
    rec.memory.begin(first, None)
    assert not rec.memory.service_event({**first, "status": {"observedGeneration": 2}})
    assert rec.memory.service_event({**first, "metadata": {**first["metadata"], "generation": 3}})
    assert rec.memory.service_event({**first, "metadata": {**first["metadata"], "uid": "u2"}})
    state_of(rec).forget("serving", "llama", "u1")
    assert rec.memory.service_event(first)


@pytest.mark.parametrize(
    ("outcome", "retry", "spread", "delay"),
    [
        (ModelConfigUnavailable("hub down"), 0, 0.5, 10.0),  # the band's middle: 10 s x 2^n
        (ModelConfigUnavailable("hub down"), 0, 0.0, 8.0),  # -20%
        (ModelConfigUnavailable("hub down"), 0, 0.75, 11.0),
        (ModelConfigUnavailable("hub down"), 3, 0.5, 80.0),
        (ModelConfigUnavailable("hub down"), 9, 0.0, 240.0),  # capped at 300 s, then jittered
        (TransientApiError("reset"), 7, 0.5, 5.0),  # soon, whatever the attempt
        (TransientApiError("reset"), 0, 0.0, 4.0),
        (NoEligibleNode({"n0": "too small"}), 0, 0.9, None),  # a refusal waits for a change
        (None, 0, 0.5, None),
    ],
)
def test_retry_delays_back_off_within_a_jitter_band(outcome, retry, spread, delay):
    """Services one outage failed together retry spread over ±20% of the delay, not all at once."""
    assert retry_delay(outcome, retry, spread) == (pytest.approx(delay) if delay is not None else None)


def owners_from_applies(kube: StubKube) -> None:
    """The API server's record of what exists: each applied child, controlled by its controller reference, at a
    resourceVersion bumped by each write."""
    versions = itertools.count(1)

    def apply(manifest: dict[str, Any], over: Ownership | None) -> dict[str, Any]:
        meta = manifest["metadata"]
        key = (manifest["kind"], meta["namespace"], meta["name"])
        existing = kube.owners.get(key)
        if over is None and existing is not None:  # a create, where the object exists
            raise ChildExists(f"{key} exists")
        assert over in (None, existing)  # a write over an object names it as it is
        controller = next(ref["uid"] for ref in meta["ownerReferences"] if ref.get("controller"))
        kube.owners[key] = Ownership(uid=f"{key}", controller_uid=controller, resource_version=str(next(versions)))
        kube.applied.append(manifest)
        return manifest

    kube.apply = apply


def named(spec: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    body = service(spec)
    body["metadata"] = {**body["metadata"], "name": name, "uid": uid}
    return body


def test_a_child_another_service_of_this_process_applied_is_never_taken_over():
    """Service `llama-servers` renders a Service of the name that service llama's router mode applied for its
    servers: this process applied that name before, yet it is read again and refused, not force-applied over
    llama's (which took llama's traffic and controller reference)."""
    rec, kube = reconciler()
    owners_from_applies(kube)
    router = {"routing": {"mode": "router"}}
    assert not isinstance(
        rec.reconcile(named(router, "llama", "u1"), ClusterView(nodes=NODES, deployment=READY)), ChildConflict
    )
    theirs = kube.owners[("Service", "serving", "llama-servers")]
    assert theirs.controller_uid == "u1"
    applied = len(kube.applied)
    outcome = rec.reconcile(named({}, "llama-servers", "u2"), ClusterView(nodes=NODES, deployment=READY))
    assert isinstance(outcome, ChildConflict)
    assert outcome.message.startswith("Service serving/llama-servers exists and is not controlled by this")
    assert kube.owners[("Service", "serving", "llama-servers")] == theirs
    assert "Deployment" not in [m["kind"] for m in kube.applied[applied:]]


def test_a_service_made_again_under_its_old_name_does_not_take_its_predecessors_children():
    """Until the garbage collector removes the children of a deleted service, a new one of the same name (another
    uid) finds them controlled by the old one: a conflict, retried, never a takeover; its own are then written
    with the resourceVersion their read gave."""
    rec, kube = reconciler()
    owners_from_applies(kube)
    rec.reconcile(named({}, "llama", "u1"), ClusterView(nodes=NODES, deployment=READY))
    state_of(rec).forget("serving", "llama", "u1")
    assert isinstance(
        rec.reconcile(named({}, "llama", "u2"), ClusterView(nodes=NODES, deployment=READY)), ChildConflict
    )
    kube.owners.clear()  # collected
    rec.reconcile(named({}, "llama", "u2"), ClusterView(nodes=NODES, deployment=READY))
    rec.reconcile(
        named({"kvCacheGiB": 5}, "llama", "u2"), ClusterView(nodes=NODES, deployment=READY)
    )  # a spec change: read, then written over
    assert {o.controller_uid for o in kube.owners.values()} == {"u2"}


def test_a_deployment_whose_pods_cannot_be_created_needs_a_reconcile_its_counts_alone_would_not_show():
    """The ReplicaSet's FailedCreate changes no replica count: without this the service stayed Progressing."""
    rec, kube = reconciler()
    applied_with_markers(kube)
    ticket = rec.memory.begin(service({}), {"status": {"replicas": 0}})
    rec.reconcile(service({}), ClusterView(nodes=NODES, deployment={"status": {"replicas": 0}}), ticket=ticket)
    failed = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "exceeded quota"}
    body = {"metadata": {"generation": 1}, "status": {"replicas": 0, "conditions": [failed]}}
    assert rec.memory.child_event("Deployment", "serving", "llama", "MODIFIED", body, "llama")
    ticket = rec.memory.begin(service({}), body)
    outcome = rec.reconcile(service({}), ClusterView(nodes=NODES, deployment=body), ticket=ticket)
    assert outcome is not None and kube.status_patches[-1]["conditions"][1]["reason"] == "FailedCreate"
    assert not rec.memory.child_event("Deployment", "serving", "llama", "MODIFIED", body, "llama")  # read already
