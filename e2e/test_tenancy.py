"""Many tenants, one operator, against the real API server: what a tenant who may create a CpuLLMService must not
be able to do (adopt another's object, name what the children cannot take, override what the operator owns,
point it at a Secret that did not opt in), and that one tenant's bad spec never stops another's service."""

from __future__ import annotations

import base64
import copy
import json
import urllib.request

import pytest
from kubernetes import client, config
from testbed.objects import QWEN_SMALL, tiny_service
from testbed.operator import InClusterOperator, Operator
from testbed.tools import Kubectl, eventually

from cpullm.errors import ChildExists
from cpullm.io.kube import FIELD_MANAGER, Kube
from e2e.support import LogMark, conditions, events, not_planned, ready


def test_a_same_name_service_someone_else_made_is_not_adopted(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    """The operator used to server-side apply over it with force: its selector then routed to the new pods and
    it carried an owner reference, so it went with the CpuLLMService. Now it is a Conflict, left untouched, and
    the service is served as soon as the name is free."""
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "taken", "namespace": namespace},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]},
    }
    kubectl.apply(theirs)
    kubectl.apply(tiny_service("taken", namespace))
    refused = not_planned(kubectl, namespace, "taken", "Conflict")
    assert conditions(refused)["Planned"]["message"].startswith(
        f"Service {namespace}/taken exists and is not controlled by this CpuLLMService"
    )
    service = kubectl.get("service", "taken", namespace)
    assert service["spec"]["selector"] == {"app": "theirs"} and "ownerReferences" not in service["metadata"]
    assert kubectl.get("deployment", "taken", namespace) is None  # no server started
    kubectl.run("delete", "service", "taken", "-n", namespace)
    ready(kubectl, namespace, "taken", 1, timeout=120)  # retried with backoff: the name is free now


def test_an_apply_that_may_only_create_makes_what_is_absent_and_leaves_what_exists(kubectl: Kubectl, namespace: str):
    """What io/kube.py's first writes rest on (the resourceVersion no object holds), held to the real API server: an
    absent object is made; one that exists, the operator's or someone else's with the very same values (which a
    plain apply would share and take a controller reference on), is refused and left as it was."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubectl.kubeconfig, client_configuration=configuration)
    kube = Kube(client.ApiClient(configuration))

    def config_map(name: str, value: str) -> dict[str, object]:
        meta = {"name": name, "namespace": namespace}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"key": value}}

    made = kube.apply(config_map("made", "1"), None)
    assert made["metadata"]["uid"] and made["data"] == {"key": "1"}
    with pytest.raises(ChildExists):
        kube.apply(config_map("made", "2"), None)
    assert kubectl.get("configmap", "made", namespace)["data"] == {"key": "1"}

    kubectl.apply(config_map("theirs", "1"))
    before = kubectl.get("configmap", "theirs", namespace)
    with pytest.raises(ChildExists):
        kube.apply(config_map("theirs", "1"), None)
    after = kubectl.get("configmap", "theirs", namespace)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    managers = kubectl.run(
        "get", "configmap", "theirs", "-n", namespace, "--show-managed-fields", "-o", "jsonpath={..manager}"
    ).stdout
    assert FIELD_MANAGER not in managers.split(), managers


def test_a_child_of_another_service_is_not_taken_over_by_a_service_named_like_it(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    """Service x in router mode has a headless Service x-servers; a CpuLLMService named x-servers renders a
    Service of that name. The operator had applied x-servers for x, so it skipped the ownership read and
    force-applied over it: x-servers' selector and controller reference became the second service's, and x's
    router lost its servers. Now the second service is a Conflict and x's Service is left as it was."""
    kubectl.apply(tiny_service("x", namespace, routing={"mode": "router"}))
    ready(kubectl, namespace, "x", 1)
    uid = kubectl.get("cpullm", "x", namespace)["metadata"]["uid"]
    before = kubectl.get("service", "x-servers", namespace)
    assert [r["uid"] for r in before["metadata"]["ownerReferences"] if r.get("controller")] == [uid]
    kubectl.apply(tiny_service("x-servers", namespace))
    refused = not_planned(kubectl, namespace, "x-servers", "Conflict")
    assert conditions(refused)["Planned"]["message"].startswith(
        f"Service {namespace}/x-servers exists and is not controlled by this CpuLLMService"
    )
    after = kubectl.get("service", "x-servers", namespace)
    assert after["spec"]["selector"] == before["spec"]["selector"]
    assert after["metadata"]["ownerReferences"] == before["metadata"]["ownerReferences"]
    assert kubectl.get("deployment", "x-servers", namespace) is None  # nothing of the second service applied


@pytest.mark.parametrize("name", ["qwen.small", "q" * 64, "Qwen"])
def test_a_name_the_children_cannot_take_is_refused_at_admission(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, name: str
):
    result = kubectl.apply(tiny_service(name, namespace), check=False)
    assert result.returncode != 0 and "must be a DNS-1035 label of at most 63 characters" in result.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "64"}]}, "VLLM_CPU_KVCACHE_SPACE (use spec.kvCacheGiB)"),
        ({"env": [{"name": "LD_PRELOAD", "value": "/tmp/x.so"}]}, "env sets a variable the operator owns"),
        ({"extraArgs": ["--port=9999"]}, "extraArgs sets a flag the operator owns"),
        ({"extraArgs": ["--tensor-parallel-size", "8"]}, "--tensor-parallel-size (use spec.tensorParallelSize)"),
        ({"extraArgs": ["--max_model_len=64"]}, "extraArgs sets a flag the operator owns or refuses"),
        ({"extraArgs": ["--tensor_parallel_size", "8"]}, "extraArgs sets a flag the operator owns or refuses"),
        ({"extraArgs": ["--api-key", "sk-e2e"]}, "--api-key (use spec.apiKeySecret)"),
        ({"extraArgs": ["--config", "/tmp/flags.yaml"]}, "--config (a file of flags the operator cannot check"),
        ({"env": [{"name": "HUGGING_FACE_HUB_TOKEN", "value": "hf_e2e"}]}, "HUGGING_FACE_HUB_TOKEN (a token in"),
        ({"env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]}, "VLLM_SERVER_DEV_MODE (adds development routes"),
        ({"env": [{"name": "X", "valueFrom": {}}]}, "valueFrom needs exactly one of configMapKeyRef"),
        ({"extraArgs": ["--lora-modules", "a=/tmp/x"]}, "--lora-modules (use spec.adapters)"),
        ({"env": [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "1"}]}, "loads adapters on request"),
        ({"adapters": [{"name": "a", "source": "org/a", "rank": 8}] * 2}, "Duplicate value"),
        (
            {"autoscaling": {"kind": "keda", "maxReplicas": 2, "prometheusAddress": "http://169.254.169.254/x"}},
            "prometheusAddress must not name a loopback or link-local host",
        ),
    ],
)
def test_env_and_args_the_operator_owns_are_refused_at_admission(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, spec, message
):
    result = kubectl.apply(tiny_service("owned", namespace, **spec), check=False)
    assert result.returncode != 0 and message in result.stderr
    assert "sk-e2e" not in result.stderr and "hf_e2e" not in result.stderr


def test_a_spec_nested_too_deep_is_refused_without_a_traceback(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    """A free-form field (an inline config.json) 600 levels deep passes the API server; it raised RecursionError
    in Kopf's diff base and the operator's copies of the service: no status, a traceback per event. It is an
    InvalidSpec now (controller/kopf_settings.py's NoDiffBase, api/spec.py's copy_json and too_deep)."""
    deep: dict = {}
    for _ in range(600):
        deep = {"a": deep}
    mark = LogMark(operator) if isinstance(operator, Operator) else None
    model = copy.deepcopy(QWEN_SMALL["spec"]["model"])
    model["config"]["deep"] = deep
    # As JSON: the test bed's YAML writer recurses once per level too.
    kubectl.run("apply", "-f", "-", input=json.dumps(tiny_service("deep", namespace, model=model)))
    refused = not_planned(kubectl, namespace, "deep", "InvalidSpec")
    assert "nested more than 64 levels deep" in conditions(refused)["Planned"]["message"]
    if mark:
        mark.assert_quiet()


def test_a_secret_that_did_not_opt_in_is_not_read_and_never_shown(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    """hfTokenSecret may name any Secret of the namespace: a TLS key's value must not reach status, events, the
    log or the metrics. Without the opt-in label it is refused; with it, a value a header cannot carry is refused
    without being shown (a token's trailing newline, as kubectl create secret --from-file leaves it, is trimmed:
    tests/unit/test_hub.py)."""
    secret_value = "-----BEGIN PRIVATE KEY----- do-not-leak-4e1f"
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "tls", "namespace": namespace},
            "data": {"tls.key": base64.b64encode(secret_value.encode()).decode()},
        }
    )
    mark = LogMark(operator) if isinstance(operator, Operator) else None
    hub_model = {"name": "org/gated-model"}  # no inline config: the token would be read for the Hub
    kubectl.apply(tiny_service("leaky", namespace, model=hub_model, hfTokenSecret={"name": "tls", "key": "tls.key"}))

    def refused_without_the_value() -> bool:
        service = kubectl.get("cpullm", "leaky", namespace)
        planned = conditions(service).get("Planned", {})
        assert planned.get("reason") == "ModelConfigUnavailable", planned
        return "is not labelled cpullm.io/hf-token=true" in planned["message"]

    eventually(refused_without_the_value, timeout=60, what="the unlabelled Secret refused")
    kubectl.run("label", "secret", "tls", "-n", namespace, "cpullm.io/hf-token=true")
    kubectl.apply(
        tiny_service("leaky", namespace, model=hub_model, hfTokenSecret={"name": "tls", "key": "tls.key"}, replicas=2)
    )  # fmt: skip  (a spec change: reconciled again)

    def refused_as_no_token() -> bool:
        planned = conditions(kubectl.get("cpullm", "leaky", namespace)).get("Planned", {})
        return planned.get("reason") == "ModelConfigUnavailable" and "is not a token" in planned["message"]

    eventually(refused_as_no_token, timeout=60, what="a value a header cannot carry refused")

    def events_with_the_refusal() -> str | None:
        # Events are posted after the status: the one this refusal sends must be among those searched for the value.
        listed = kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout
        return listed if any("is not a token" in e.get("message", "") for e in json.loads(listed)["items"]) else None

    posted = eventually(events_with_the_refusal, timeout=30, what="the refusal's event")
    metrics = ""
    if isinstance(operator, Operator) and operator.metrics_url:
        with urllib.request.urlopen(operator.metrics_url, timeout=10) as response:
            metrics = response.read().decode()
    everything = posted + str(kubectl.get("cpullm", "leaky", namespace)) + (mark.text() if mark else "") + metrics
    assert "do-not-leak" not in everything and "PRIVATE KEY" not in everything
    if mark:
        mark.assert_quiet()


def test_one_bad_affinity_never_stops_another_services_reconcile(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    """Gt with a non-integer passes the API server (the schema types spec.affinity, but a value's meaning under an
    operator is no schema's) and once raised ValueError in the eligibility chain: that service got no status, and
    every node event's check aborted. It is an InvalidSpec now, parsed once at the boundary."""
    bad = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["many"]}]}]
            }
        }
    }
    mark = LogMark(operator) if isinstance(operator, Operator) else None
    kubectl.apply(tiny_service("odd", namespace, affinity=bad))
    refused = not_planned(kubectl, namespace, "odd", "InvalidSpec")
    assert "values must be one integer for operator Gt" in conditions(refused)["Planned"]["message"]
    kubectl.apply(tiny_service("healthy", namespace))
    ready(kubectl, namespace, "healthy", 1)
    if mark:
        mark.assert_quiet()


def test_network_policies_follow_the_routing_and_the_opt_out(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    """The API server admits the NetworkPolicies as rendered: in router mode the servers admit only their router and
    the router admits the namespace (plus Prometheus' namespace on its metrics port); through the Service, the
    router's goes; spec.networkPolicy.enabled false, both go. (Enforced by a real implementation: e2e/test_kind.py.)"""
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    routed = {"mode": "router"}
    kubectl.apply(tiny_service("guarded", namespace, routing=routed, networkPolicy={"metricsFrom": [prometheus]}))
    ready(kubectl, namespace, "guarded", 1)

    def policies() -> dict[str, dict]:
        listed = kubectl.run("get", "networkpolicies", "-n", namespace, "-o", "json").stdout
        return {p["metadata"]["name"]: p["spec"] for p in json.loads(listed)["items"]}

    found = eventually(lambda: len(policies()) == 2 and policies(), timeout=60, what="both NetworkPolicies")
    router = {"cpullm.io/router": "guarded"}
    assert found["guarded"]["podSelector"] == {"matchLabels": {"cpullm.io/service": "guarded"}}
    assert found["guarded"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": router}}]
    # The servers' egress, IPv4 and IPv6 blocks alike, admitted as rendered (kind enforces it: e2e/test_quickstart.py).
    assert found["guarded"]["policyTypes"] == ["Ingress", "Egress"]
    blocks = [peer["ipBlock"]["cidr"] for rule in found["guarded"]["egress"] for peer in rule.get("to", [])]
    assert blocks == ["0.0.0.0/0", "::/0"], found["guarded"]["egress"]
    assert found["guarded-router"]["ingress"] == [
        {"from": [{"podSelector": {}}], "ports": [{"port": 8000, "protocol": "TCP"}]},
        {"from": [prometheus], "ports": [{"port": 8404, "protocol": "TCP"}]},
    ]
    kubectl.apply(tiny_service("guarded", namespace, routing={"mode": "service"}))

    def through_the_service() -> bool:
        # Both halves awaited together: what one observes says nothing of when the reconcile wrote the other.
        now = policies()
        assert list(now) == ["guarded"], now
        assert now["guarded"]["ingress"][0]["from"] == [{"podSelector": {}}], now["guarded"]
        return True

    eventually(through_the_service, timeout=60, what="the router's NetworkPolicy deleted, the servers' widened")
    kubectl.apply(tiny_service("guarded", namespace, routing={"mode": "service"}, networkPolicy={"enabled": False}))
    eventually(lambda: policies() == {}, timeout=60, what="no NetworkPolicy once opted out")


@pytest.mark.parametrize(
    ("cache", "admitted"),
    [
        ({"persistentVolumeClaim": {"claimName": "weights"}}, True),
        ({"emptyDir": {"sizeLimit": "4Gi"}}, True),
        ({"nodeLocal": True}, True),  # the CRD's rule knew only the first two: refused at admission
        ({"nodeLocal": False}, False),
        ({"emptyDir": {}, "nodeLocal": True}, False),
        ({}, False),
    ],
    ids=["claim", "empty-dir", "node-local", "node-local-false", "two", "none"],
)
def test_each_form_of_the_model_cache_is_admitted_and_only_one(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, cache, admitted
):
    """The CRD's rule is generated from the model's one table (api/spec.py MODEL_CACHE_SOURCES): exactly one."""
    result = kubectl.apply(tiny_service("cached", namespace, modelCache=cache), check=False)
    assert (result.returncode == 0) is admitted, result.stderr
    if not admitted:
        assert "modelCache needs exactly one of persistentVolumeClaim, emptyDir, nodeLocal" in result.stderr


def test_pods_a_quota_forbids_are_the_services_ready_reason(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    """The ReplicaSet cannot create the servers' pods (here a quota of 0 pods; an admission webhook or an invalid
    image reference alike): the service used to stay Ready=False/Progressing forever with no cause."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods", "namespace": namespace},
        "spec": {"hard": {"pods": "0"}},
    }
    kubectl.apply(quota)
    kubectl.apply(tiny_service("quoted", namespace))

    def refused() -> dict:
        found = conditions(kubectl.get("cpullm", "quoted", namespace)).get("Ready", {})
        assert (found.get("status"), found.get("reason")) == ("False", "FailedCreate"), found
        return found

    ready_condition = eventually(refused, timeout=120, what="Ready=False, reason FailedCreate")
    assert "pods cannot be created" in ready_condition["message"] and "exceeded quota" in ready_condition["message"]

    eventually(  # events are posted after the status
        lambda: any(e["reason"] == "FailedCreate" for e in events(kubectl, namespace, "quoted")),
        timeout=30,
        what="a FailedCreate event about the CpuLLMService",
    )
