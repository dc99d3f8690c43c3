"""vLLM sizes what no formula knows, through a Job in the service's image (core/children/sizing_job.py,
controller/vllm_sizing.py): the Job's shape, the one question it asks per config, dtype and image, the answer kept in
status, and every state of the Job a reconcile can meet. The report is what cpullm/meta_size.py printed with vLLM 0.32
for GPT-2 (fixtures/vllm_reports/gpt2.json); tests/vllm/test_oracle.py checks the same path against vLLM itself."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.controller.outcomes import SIZING_RETRY_SECONDS, retry_delay
from cpullm.controller.reconcile import Reconciler
from cpullm.controller.vllm_sizing import JobSizer
from cpullm.core.children.common import SERVICE_LABEL, Owner
from cpullm.core.children.sizing_job import (
    CONFIG_ENV,
    STATUS_KEY,
    SizingJobFacts,
    build_sizing_job,
    sizing_arch,
    sizing_job_name,
    sizing_request,
)
from cpullm.core.observation import ClusterView, Ownership
from cpullm.core.sizing.vllm_report import parse_report, report_from_text
from cpullm.errors import ChildConflict, SizingWithVllm, UnsupportedModel, VllmSizingFailed
from cpullm.meta_size import REPORT, REPORT_LIMIT, _fitted, main

from .builders import LLAMA_8B, node
from .support import StubHub, StubKube

GPT2 = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
    "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-05, "bos_token_id": 50256, "eos_token_id": 50256,
}  # fmt: skip
REPORT_GPT2 = json.loads((Path(__file__).parent / "fixtures" / "vllm_reports" / "gpt2.json").read_text())
OWNER = Owner("chat", "team-a", "u1")
IMAGE = "registry.example/vllm-cpu:v0.32.0"


def spec(**fields: Any) -> CpuLLMServiceSpec:
    return CpuLLMServiceSpec.model_validate(
        {"model": {"name": "example/gpt2", "config": GPT2}, "image": IMAGE, "kvCacheGiB": 1, **fields}
    )


class Jobs:
    """Sizing Jobs as the API shows them, by name; records what was read."""

    def __init__(self, jobs: dict[str, SizingJobFacts] | None = None) -> None:
        self.jobs, self.reads = jobs or {}, []

    def read_sizing_job(self, namespace: str, name: str) -> SizingJobFacts | None:
        self.reads.append((namespace, name))
        return self.jobs.get(name)


def request(dtype: str = "bfloat16", image: str = IMAGE, config: dict[str, Any] = GPT2):
    return sizing_request(config, dtype, image, "amd64")


def test_the_job_is_least_privileged_bounded_and_apart_from_the_servers():
    job = build_sizing_job(OWNER, spec(nodeSelector={"pool": "cpu"}), request())
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u1"
    # No label of the servers on its pod: no Service, PodMonitor or policy of theirs selects it.
    assert SERVICE_LABEL not in job["spec"]["template"]["metadata"]["labels"]
    assert (pod["automountServiceAccountToken"], pod["restartPolicy"]) == (False, "Never")
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": 1001,
        "runAsGroup": 1001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (0, 600)
    assert job["spec"]["ttlSecondsAfterFinished"] == 300
    assert pod["nodeSelector"] == {"pool": "cpu", "kubernetes.io/arch": "amd64"}
    # The in-pod script itself, the config as its environment gives it, the report to the termination message.
    assert container["command"][:2] == ["python3", "-c"] and "def measure(" in container["command"][2]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert json.loads(env[CONFIG_ENV]) == GPT2 and env["HF_HUB_OFFLINE"] == "1"
    assert container["args"][-2:] == ["--report-file", "/dev/termination-log"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["image"] == IMAGE


def test_a_job_name_fits_a_label_for_the_longest_service_name():
    name = sizing_job_name(Owner("a" * 63, "ns"), request())
    assert len(name) <= 63 and name.endswith(f"-size-{request().key[:10]}")


def test_one_question_one_key():
    reordered = dict(reversed(GPT2.items()))
    assert request().key == request(config=reordered).key
    assert len({request().key, request(dtype="float32").key, request(image="other:v0.31.0").key}) == 3


@pytest.mark.parametrize(
    ("nodes", "selector", "arch"),
    [
        ([], None, "amd64"),
        ([("a", "arm64"), ("b", "arm64"), ("c", "amd64")], None, "arm64"),
        ([("a", "arm64"), ("b", "amd64")], None, "amd64"),  # a tie: amd64
        ([("a", "arm64"), ("b", "amd64"), ("c", "amd64")], {"pool": "a"}, "arm64"),  # the nodes the spec admits
    ],
    ids=["no-nodes", "most-common", "tie", "node-selector"],
)
def test_the_job_runs_the_arch_the_servers_most_likely_will(nodes, selector, arch):
    profiles = [node(name, arch=a, labels={"pool": name}) for name, a in nodes]
    fields = {"nodeSelector": selector} if selector else {}
    assert sizing_arch(spec(**fields), profiles) == arch


FINISHED = SizingJobFacts(finished=True, message=REPORT + json.dumps(REPORT_GPT2), controller_uid="u1")
RUNNING = SizingJobFacts(finished=False, controller_uid="u1")
NAME = sizing_job_name(OWNER, request())


@pytest.mark.parametrize(
    ("status", "jobs", "raised", "creates", "reads"),
    [
        ({}, {}, SizingWithVllm, True, 1),
        ({}, {NAME: RUNNING}, SizingWithVllm, False, 1),
        ({}, {NAME: FINISHED}, None, False, 1),
        ({STATUS_KEY: {"key": request().key, "report": json.dumps(REPORT_GPT2)}}, {}, None, False, 0),
        ({STATUS_KEY: {"key": "another-question", "report": json.dumps(REPORT_GPT2)}}, {}, SizingWithVllm, True, 1),
        ({}, {NAME: SizingJobFacts(True, "Traceback ...\nMemoryError", "Failed", "u1")}, VllmSizingFailed, False, 1),
        # A Job of that name the service does not control (a tenant's, with a report of its making): not trusted.
        ({}, {NAME: SizingJobFacts(True, FINISHED.message, "", "someone-else")}, ChildConflict, False, 1),
        ({}, {NAME: SizingJobFacts(True, FINISHED.message, "", None)}, ChildConflict, False, 1),
    ],
    ids=[
        "no-job", "running", "finished", "kept-in-status", "status-for-another-config", "died-without-report",
        "forged-by-another-controller", "forged-without-controller",
    ],
)  # fmt: skip
def test_each_state_of_the_question(status, jobs, raised, creates, reads):
    api = Jobs(jobs)
    sizer = JobSizer(OWNER, spec(), status, [node()], api, {})
    if raised is None:
        assert sizer(GPT2, "bfloat16") == REPORT_GPT2
        assert sizer.outcome.record["key"] == request().key and sizer.outcome.request is None
    else:
        with pytest.raises(raised) as err:
            sizer(GPT2, "bfloat16")
        assert f"team-a/{NAME}" in err.value.message
        assert (sizer.outcome.request is not None) is creates and sizer.outcome.record is None
    assert len(api.reads) == reads


def test_a_job_whose_pod_cannot_run_says_why_while_it_waits():
    stuck = SizingJobFacts(False, controller_uid="u1", trouble="a pod cannot be scheduled: 0/3 nodes are available")
    with pytest.raises(SizingWithVllm) as err:
        JobSizer(OWNER, spec(), {}, [], Jobs({NAME: stuck}), {})(GPT2, "bfloat16")
    assert err.value.message.endswith("; a pod cannot be scheduled: 0/3 nodes are available (the Job ends after 600 s)")


def test_a_job_that_died_says_why_in_its_own_words():
    api = Jobs(
        {NAME: SizingJobFacts(True, "Traceback ...\nMemoryError: cannot allocate", "BackoffLimitExceeded", "u1")}
    )
    with pytest.raises(VllmSizingFailed) as err:
        JobSizer(OWNER, spec(), {}, [], api, {})(GPT2, "bfloat16")
    assert "(BackoffLimitExceeded: MemoryError: cannot allocate)" in err.value.message
    assert retry_delay(err.value, 0) == 10  # backoff, from 10 s


def test_vllms_refusal_is_kept_and_is_the_plans_refusal():
    refused = {"vllm": "0.32.0", "error": "ValueError: Mamba-1's prefill needs a selective scan kernel"}
    api = Jobs({NAME: SizingJobFacts(True, REPORT + json.dumps(refused), controller_uid="u1")})
    rec, kube = reconciler(api)
    outcome = rec.reconcile(service(), ClusterView(nodes=[node()]))
    assert isinstance(outcome, UnsupportedModel) and "selective scan kernel" in outcome.message
    (patch,) = kube.status_patches
    assert json.loads(patch[STATUS_KEY]["report"]) == refused  # asked once: not again at the next reconcile


class SizingKube(StubKube):
    def __init__(self, jobs: Jobs) -> None:
        super().__init__()
        self.jobs = jobs

    def read_sizing_job(self, namespace, name):
        return self.jobs.read_sizing_job(namespace, name)


def reconciler(jobs: Jobs) -> tuple[Reconciler, SizingKube]:
    kube = SizingKube(jobs)
    return Reconciler(kube, StubHub(), clock=lambda: datetime(2026, 1, 1, tzinfo=UTC)), kube


def service(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "u1", "generation": 1},
        "spec": {"model": {"name": "example/gpt2", "config": GPT2}, "image": IMAGE, "kvCacheGiB": 1},
        "status": status or {},
    }


def test_a_reconcile_asks_vllm_once_then_plans_from_its_answer():
    jobs = Jobs()
    rec, kube = reconciler(jobs)
    view = ClusterView(nodes=[node()])
    # 1: no Job yet: it is created, and the service says what it waits for; looked at again soon.
    outcome = rec.reconcile(service(), view)
    assert isinstance(outcome, SizingWithVllm) and retry_delay(outcome, 5) == SIZING_RETRY_SECONDS
    assert [(m["kind"], m["metadata"]["name"]) for m in kube.applied] == [("Job", NAME)]
    planned = kube.status_patches[-1]["conditions"][0]
    assert (planned["status"], planned["reason"]) == ("False", "SizingWithVllm")
    # 2: running: nothing more is created.
    jobs.jobs[NAME] = RUNNING
    assert isinstance(rec.reconcile(service(kube.status_patches[-1]), view), SizingWithVllm)
    assert len(kube.applied) == 1
    # 3: finished: planned from vLLM's report, which status keeps.
    jobs.jobs[NAME] = FINISHED
    plan = rec.reconcile(service(kube.status_patches[-1]), view)
    assert (
        plan.weights_bytes == REPORT_GPT2["weights_bytes"] and plan.sizing.weights_source == "vLLM 0.32.0 (meta device)"
    )
    status = {**kube.status_patches[0], **kube.status_patches[-1]}
    assert status[STATUS_KEY]["key"] == request().key
    # 4: the Job is gone (Kubernetes' TTL): status answers, nothing is read or created.
    del jobs.jobs[NAME]
    reads = len(jobs.reads)
    rec.reconcile(service(status), view)
    assert len(jobs.reads) == reads and [m["kind"] for m in kube.applied].count("Job") == 1


def test_a_job_of_that_name_someone_else_made_is_a_conflict():
    rec, kube = reconciler(Jobs())
    kube.owners[("Job", "team-a", NAME)] = Ownership(uid="j1", controller_uid="someone-else")
    outcome = rec.reconcile(service(), ClusterView(nodes=[node()]))
    assert outcome.reason == "Conflict" and not [m for m in kube.applied if m["kind"] == "Job"]


def test_the_answer_is_dropped_once_a_formula_sizes_the_model():
    rec, kube = reconciler(Jobs())
    llama = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "kvCacheGiB": 1, "maxModelLen": 4096}
    kept = {STATUS_KEY: {"key": "k", "image": IMAGE, "report": "{}"}}
    rec.reconcile({**service(kept), "spec": llama}, ClusterView(nodes=[node()]))
    assert kube.status_patches[-1][STATUS_KEY] is None  # a merge patch's removal


@pytest.mark.parametrize(
    "text",
    ["", "no report here", REPORT + "{not json", REPORT + "[1, 2]", REPORT + "{}" + " " * 20000, 42],
    ids=["empty", "no-line", "not-json", "not-an-object", "too-long", "not-text"],
)
def test_what_is_not_a_report_is_none(text):
    assert report_from_text(text) is None


def test_the_last_report_line_is_the_report():
    text = f'log line\n{REPORT}{{"a": 1}}\nmore log\n{REPORT}{{"a": 2}}\n'
    assert report_from_text(text) == {"a": 2} and parse_report('{"a": 3}') == {"a": 3}


def test_a_report_fits_a_termination_message():
    long = {"vllm": "0.32.0", "error": "E" * 2000, "tensor_parallel": {str(n): "R" * 300 for n in range(8)}}
    fitted = _fitted(long)
    assert len(fitted) <= REPORT_LIMIT and json.loads(fitted)["error"].startswith("E")


def test_the_script_without_vllm_reports_why(tmp_path, monkeypatch, capsys):
    """Where vLLM cannot even be imported the line still comes, with the error, in the file the Job gives."""
    monkeypatch.setenv("CFG", json.dumps(GPT2))
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # as in an image without torch
    out = tmp_path / "termination-log"
    assert main(["--config-env", "CFG", "--report-file", str(out)]) == 0
    report = report_from_text(out.read_text())
    assert report is not None and "error" in report and report_from_text(capsys.readouterr().out) == report


def test_sized_by_vllm_has_a_job_size_a_model_the_formulas_know():
    rec, kube = reconciler(Jobs())
    llama = {"model": {"name": "meta-llama/Llama-3.1-8B", "sizedBy": "vllm"}, "kvCacheGiB": 1, "maxModelLen": 4096}
    outcome = rec.reconcile({**service(), "spec": llama}, ClusterView(nodes=[node()]))
    assert isinstance(outcome, SizingWithVllm)
    (job,) = kube.applied
    env = job["spec"]["template"]["spec"]["containers"][0]["env"][0]
    assert job["kind"] == "Job" and env["name"] == CONFIG_ENV and json.loads(env["value"]) == LLAMA_8B  # the Hub's
