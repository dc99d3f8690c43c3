"""The operator against a real API server, scheduler and controller manager (KWOK nodes and pods)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed.objects import E2E_LABEL, fake_node, sample_nodes, tiny_service
from testbed.operator import InClusterOperator, Operator
from testbed.tools import ROOT, Kubectl, eventually

from e2e.support import NodePool, conditions, container, events, not_planned, ready

EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


def deployment(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return eventually(lambda: kubectl.get("deployment", name, namespace), timeout=60, what="Deployment")


def env(deploy: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container(deploy)["env"]}


def cli(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "cpullm", *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_examples_run_as_planned(
    example: Path,
    kubectl: Kubectl,
    operator: Operator | InClusterOperator,
    namespace: str,
    nodes: NodePool,
    tmp_path: Path,
):
    # A private copy of the sample nodes: the big examples take whole nodes, other tests' pods must not.
    suffix = namespace[-5:]
    private = []
    for node in sample_nodes():
        labels = node["metadata"]["labels"]
        del labels[E2E_LABEL]
        node["metadata"]["name"] = labels["kubernetes.io/hostname"] = f"{node['metadata']['name']}-{suffix}"
        labels["pool"] = namespace
        private.append(node)
        nodes.add(node)
    service = yaml.safe_load(example.read_text())
    service["metadata"]["namespace"] = namespace
    service["spec"]["nodeSelector"] = {"pool": namespace}
    name = service["metadata"]["name"]
    (tmp_path / "svc.yaml").write_text(yaml.safe_dump(service))
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump_all(private))
    expected_plan = json.loads(
        cli("plan", str(tmp_path / "svc.yaml"), "--nodes", str(tmp_path / "nodes.yaml"), "-o", "json")
    )
    rendered = {
        (obj["kind"], obj["metadata"]["name"]): obj
        for obj in yaml.safe_load_all(
            cli("render", str(tmp_path / "svc.yaml"), "--nodes", str(tmp_path / "nodes.yaml"))
        )
    }
    expected_deploy, expected_svc = rendered["Deployment", name], rendered["Service", name]

    kubectl.apply(service)
    replicas = service["spec"].get("replicas", 1)
    status = ready(kubectl, namespace, name, replicas)["status"]
    assert status["plan"] == expected_plan

    deploy = kubectl.get("deployment", name, namespace)
    for field in ("command", "args", "env", "image", "resources", "securityContext"):
        assert container(deploy)[field] == container(expected_deploy)[field], field
    pod_spec = deploy["spec"]["template"]["spec"]
    assert pod_spec["affinity"] == expected_deploy["spec"]["template"]["spec"]["affinity"]
    assert deploy["metadata"]["ownerReferences"][0]["kind"] == "CpuLLMService"
    assert kubectl.get("service", name, namespace)["spec"]["ports"] == expected_svc["spec"]["ports"]
    launcher = kubectl.get("configmap", f"{name}-launcher", namespace)
    assert launcher["data"] == rendered["ConfigMap", f"{name}-launcher"]["data"]
    for kind, child in rendered:  # every child rendered exists: the router's too, for the throughput example
        assert kubectl.get(kind, child, namespace) is not None, (kind, child)
    assert launcher["metadata"]["ownerReferences"][0]["kind"] == "CpuLLMService"

    pods = kubectl.get("pods", namespace=namespace, **{"cpullm.io/service": name})
    assert len(pods) == replicas
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] in expected_plan["eligibleNodes"]
    events_seen = [(e["reason"], e["count"]) for e in events(kubectl, namespace, name)]
    assert events_seen.count(("Planned", 1)) == 1, events_seen  # one decision, one event


def test_scale_subresource(kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str):
    kubectl.apply(tiny_service("scaled", namespace))
    ready(kubectl, namespace, "scaled", 1)
    kubectl.run("scale", "cpullm/scaled", "-n", namespace, "--replicas=3")
    ready(kubectl, namespace, "scaled", 3)
    assert kubectl.get("deployment", "scaled", namespace)["spec"]["replicas"] == 3
    scale = json.loads(
        kubectl.run(
            "get", "--raw", f"/apis/cpullm.io/v1alpha1/namespaces/{namespace}/cpullmservices/scaled/scale"
        ).stdout
    )
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (3, 3)
    assert scale["status"]["selector"] == "cpullm.io/service=scaled"


def test_spec_change_rolls_the_deployment(kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str):
    kubectl.apply(tiny_service("rolled", namespace))
    ready(kubectl, namespace, "rolled", 1)
    before = kubectl.get("deployment", "rolled", namespace)
    kubectl.apply(tiny_service("rolled", namespace, kvCacheGiB=3))
    after = ready(kubectl, namespace, "rolled", 1)
    assert after["status"]["plan"]["kvCacheGiB"] == 3
    deploy = kubectl.get("deployment", "rolled", namespace)
    assert env(deploy)["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert deploy["metadata"]["generation"] > before["metadata"]["generation"]

    def rolled_out() -> bool:  # the Deployment controller makes the new ReplicaSet after the generation moved
        assert len(kubectl.get("rs", namespace=namespace)) == 2, "no new ReplicaSet yet"
        return True

    eventually(rolled_out, what="a rollout: a new ReplicaSet")


def test_node_label_change_replans(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    nodes.add(fake_node(f"replan-{namespace[-5:]}", numa=2, pool=namespace))
    kubectl.apply(tiny_service("replan", namespace, nodeSelector={"pool": namespace}, tensorParallelSize=None))
    assert ready(kubectl, namespace, "replan", 1)["status"]["plan"]["tensorParallelSize"] == 2
    kubectl.run("label", "node", f"replan-{namespace[-5:]}", "cpullm.io/numa-nodes=1", "--overwrite")

    def replanned() -> bool:
        service = ready(kubectl, namespace, "replan", 1)
        assert service["status"]["plan"]["tensorParallelSize"] == 1
        args = container(kubectl.get("deployment", "replan", namespace))["args"]
        return bool(args[args.index("--tensor-parallel-size") + 1] == "1")

    eventually(replanned, timeout=60, what="re-plan to TP 1")


def test_a_whole_node_plan_leaves_room_for_a_daemonset_and_follows_it(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    """An agent DaemonSet (500m) on the service's node: the whole-node plan takes 7 of its 8 CPUs, says why, and
    takes all 8 again once the DaemonSet is gone (the operator watches DaemonSets; the chart's RBAC lets it)."""
    nodes.add(fake_node(f"room-{namespace[-5:]}", numa=1, cpu="8", memory="64Gi", pool=namespace))
    kubectl.apply(tiny_service("roomy", namespace, nodeSelector={"pool": namespace}, cpu={}))
    assert ready(kubectl, namespace, "roomy", 1)["status"]["plan"]["cpu"] == 8
    pod = {
        "nodeSelector": {"pool": namespace},
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "agent", "image": "agent", "resources": {"requests": {"cpu": "500m"}}}],
    }
    agent = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}}, "spec": pod},
        },
    }
    kubectl.apply(agent)

    def planned_cpus(cpus: int) -> dict[str, Any]:
        plan = kubectl.get("cpullm", "roomy", namespace)["status"]["plan"]
        requested = container(kubectl.get("deployment", "roomy", namespace))["resources"]["requests"]["cpu"]
        assert (plan["cpu"], str(requested)) == (cpus, str(cpus)), (plan["cpu"], requested)
        return dict(plan)

    plan = eventually(lambda: planned_cpus(7), timeout=60, what="a plan of 7 CPUs beside the DaemonSet")
    assert f"left on the nodes for: {namespace}/agent" in plan["placementNote"]
    kubectl.run("delete", "daemonset", "agent", "-n", namespace)
    plan = eventually(lambda: planned_cpus(8), timeout=60, what="all 8 CPUs once the DaemonSet is gone")
    assert "DaemonSets" not in (plan.get("placementNote") or "")


def test_losing_every_eligible_node_and_getting_it_back(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    node = fake_node(f"only-{namespace[-5:]}", numa=1, pool=namespace)
    nodes.add(node)
    kubectl.apply(tiny_service("lonely", namespace, nodeSelector={"pool": namespace}))
    ready(kubectl, namespace, "lonely", 1)

    kubectl.run("delete", "node", node["metadata"]["name"])
    refused = not_planned(kubectl, namespace, "lonely", "NoEligibleNode")
    assert "no eligible node" in conditions(refused)["Planned"]["message"]
    eventually(  # events are posted after the status
        lambda: any(
            e["reason"] == "NoEligibleNode" and e["type"] == "Warning" for e in events(kubectl, namespace, "lonely")
        ),
        timeout=30,
        what="a NoEligibleNode warning event",
    )

    nodes.add(node)
    ready(kubectl, namespace, "lonely", 1)


def test_deleting_the_service_collects_its_children(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    kubectl.apply(tiny_service("doomed", namespace))
    ready(kubectl, namespace, "doomed", 1)
    kubectl.run("delete", "cpullm", "doomed", "-n", namespace)
    eventually(lambda: kubectl.get("deployment", "doomed", namespace) is None, timeout=60, what="Deployment collected")
    eventually(lambda: kubectl.get("service", "doomed", namespace) is None, timeout=60, what="Service collected")
    eventually(lambda: not kubectl.get("pods", namespace=namespace), timeout=60, what="pods collected")


def test_drift_in_children_is_reverted(kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str):
    kubectl.apply(tiny_service("steady", namespace, replicas=2))
    ready(kubectl, namespace, "steady", 2)
    patch = {
        "spec": {
            "replicas": 5,
            "template": {
                "spec": {"containers": [{"name": "vllm", "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "64"}]}]}
            },
        }
    }
    kubectl.run("patch", "deployment", "steady", "-n", namespace, "--type=strategic", "-p", json.dumps(patch))

    def reverted() -> bool:
        deploy = kubectl.get("deployment", "steady", namespace)
        assert deploy["spec"]["replicas"] == 2
        return env(deploy)["VLLM_CPU_KVCACHE_SPACE"] == "1"

    eventually(reverted, timeout=60, what="Deployment drift reverted")
    kubectl.run("delete", "service", "steady", "-n", namespace)
    eventually(lambda: kubectl.get("service", "steady", namespace), timeout=60, what="Service recreated")
    kubectl.run("delete", "deployment", "steady", "-n", namespace)
    eventually(lambda: kubectl.get("deployment", "steady", namespace), timeout=60, what="Deployment recreated")
    kubectl.run("delete", "configmap", "steady-launcher", "-n", namespace)
    eventually(lambda: kubectl.get("configmap", "steady-launcher", namespace), timeout=60, what="ConfigMap recreated")
    ready(kubectl, namespace, "steady", 2)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"replicas": -1}, "spec.replicas: Invalid value: -1"),
        ({"cpu": {"threadsBind": "all-of-them"}}, "spec.cpu.threadsBind"),
        (
            {"cpu": {"requiredISA": ["avx-512f"]}},
            "spec.cpu.requiredISA[0]",
        ),  # a hyphen: no flag is spelt so (NFD's AVX512F is one)
        ({"maxNumSeqs": 0}, "spec.maxNumSeqs: Invalid value: 0"),
        (
            {"image": " docker.io/vllm/vllm-openai-cpu:v0.32.0"},
            "spec.image in body should match",
        ),  # no pod could pull it
        (
            {"routing": {"mode": "router", "router": {"image": "Haproxy:3"}}},
            "spec.routing.router.image in body should match",
        ),
        ({"modelCache": {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "x"}}}, "exactly one of"),
        ({"model": {"name": "m", "dtype": "int4"}}, 'spec.model.dtype: Unsupported value: "int4"'),
        (
            {
                "apiKeySecret": {"name": "k"},
                "env": [{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "p", "key": "k"}}}],
            },
            "env PYTHONPATH must be a value",
        ),
    ],
)
def test_api_server_rejects_invalid_specs(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, spec, message
):
    service = tiny_service("invalid", namespace, **spec)
    result = kubectl.apply(service, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_a_service_with_no_sizing_fields_is_served_with_the_defaults_it_shows(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    """No kvCacheGiB, maxModelLen or maxNumSeqs: the API server accepts it, and the plan says what it chose."""
    kubectl.apply(tiny_service("defaults", namespace, kvCacheGiB=None, maxModelLen=None))
    ready(kubectl, namespace, "defaults", 1)
    plan = kubectl.get("cpullm", "defaults", namespace)["status"]["plan"]
    assert (plan["maxModelLenSource"], plan["maxNumSeqsSource"], plan["kvCacheSource"]) == ("default",) * 3
    args = kubectl.get("deployment", "defaults", namespace)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "8"
    assert args[args.index("--max-model-len") + 1] == str(plan["maxModelLen"])


def test_unplannable_spec_is_a_condition_and_an_event(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    kubectl.apply(tiny_service("three", namespace, tensorParallelSize=3))
    refused = not_planned(kubectl, namespace, "three", "InvalidTensorParallelSize")
    assert "does not divide the 14 attention heads" in conditions(refused)["Planned"]["message"]
    assert kubectl.get("deployment", "three", namespace) is None
    eventually(
        lambda: [e for e in events(kubectl, namespace, "three") if e["reason"] == "InvalidTensorParallelSize"],
        timeout=30,
        what="warning event",
    )
    kubectl.apply(tiny_service("three", namespace, tensorParallelSize=2))  # fixing the spec recovers
    ready(kubectl, namespace, "three", 1)


def test_printer_columns_show_the_plan(kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str):
    kubectl.apply(tiny_service("shown", namespace, replicas=2))
    plan = ready(kubectl, namespace, "shown", 2)["status"]["plan"]
    table = kubectl.run("get", "cpullm", "-n", namespace, "-o", "wide").stdout.splitlines()
    header = ["NAME", "MODEL", "PLACEMENT", "TP", "KV", "GIB", "BIND", "REPLICAS", "READY", "STATUS", "AGE", "PLAN"]
    assert table[0].split() == header
    expected = [
        "shown",
        "Qwen/Qwen2.5-0.5B-Instruct",
        plan["placement"],
        str(plan["tensorParallelSize"]),
        str(plan["kvCacheGiB"]),
        plan["threadsBind"],
        "2",
        "2",
        "Available",
    ]
    assert table[1].split()[:9] == expected
    assert table[1].endswith(plan["summary"])


def test_pod_security_baseline_namespace_gets_a_clear_condition(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    kubectl.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    kubectl.apply(tiny_service("guarded", namespace))
    refused = not_planned(kubectl, namespace, "guarded", "PodSecurityForbidden")
    message = conditions(refused)["Planned"]["message"]
    assert "pod-security.kubernetes.io/enforce=privileged" in message and "numaPrivileges: false" in message
    assert kubectl.get("deployment", "guarded", namespace) is None  # no ReplicaSet stuck on FailedCreate
    kubectl.apply(tiny_service("guarded", namespace, numaPrivileges=False))  # the opt-out: baseline admits it
    ready(kubectl, namespace, "guarded", 1)


def test_pass_through_fields_the_api_server_refuses_become_a_condition(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str
):
    bad_env = [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.noSuchField"}}}]
    kubectl.apply(tiny_service("refused", namespace, env=bad_env))
    refused = not_planned(kubectl, namespace, "refused", "ChildRejected")
    assert "fieldPath" in conditions(refused)["Planned"]["message"]


def test_throughput_placement_fills_the_numa_nodes_behind_one_service(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    """One TP=1 server per NUMA node: two 4-NUMA nodes hold 8, so 10 requested replicas are capped to 8 (and
    said so); every pod sits on a chosen node, four per node, and the one Service selects all of them."""
    aligned = {"pool": namespace, "cpullm.io/topology-manager-policy": "single-numa-node"}
    names = [f"tput-{i}-{namespace[-5:]}" for i in range(2)]
    for name in names:
        nodes.add(fake_node(name, numa=4, cpu="32", memory="128Gi", **aligned))
    service = tiny_service(
        "tput",
        namespace,
        nodeSelector={"pool": namespace},
        placement="throughput",
        replicas=10,
        routing={"mode": "service"},
    )
    service["spec"]["cpu"] = {}  # a NUMA node's CPUs per server (8 here), not the suite's 2
    kubectl.apply(service)
    status = ready(kubectl, namespace, "tput", 8)["status"]
    plan = status["plan"]
    assert (plan["placement"], plan["tensorParallelSize"], plan["cpu"]) == ("throughput", 1, 8)
    assert (plan["replicas"], plan["capacity"], plan["eligibleNodes"]) == (8, 8, sorted(names))
    assert plan["placementNote"] == "replicas capped: 10 requested, 8 NUMA nodes on the chosen nodes"
    assert "capped" not in str(conditions(kubectl.get("cpullm", "tput", namespace))["Ready"])
    assert kubectl.get("deployment", "tput", namespace)["spec"]["replicas"] == 8

    pods = kubectl.get("pods", namespace=namespace, **{"cpullm.io/service": "tput"})
    per_node = {name: sum(p["spec"]["nodeName"] == name for p in pods) for name in names}
    assert per_node == dict.fromkeys(names, 4)

    def endpoints() -> int:
        slices = kubectl.get("endpointslices", namespace=namespace, **{"kubernetes.io/service-name": "tput"})
        count = sum(len(s.get("endpoints") or []) for s in slices)
        assert count == 8, count
        return count

    eventually(endpoints, timeout=60, what="the Service's endpoints cover all 8 servers")


def test_node_churn_of_the_same_shape_leaves_running_servers_alone(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    """Pods select nodes by the labels of their shape, so a node of the same shape joining or leaving the pool,
    or a node of another shape that changes no plan, re-plans the service but never touches the Deployment."""
    first = fake_node(f"churn-a-{namespace[-5:]}", numa=2, pool=namespace)
    nodes.add(first)
    kubectl.apply(tiny_service("churn", namespace, nodeSelector={"pool": namespace}, tensorParallelSize=None))
    ready(kubectl, namespace, "churn", 1)
    before = kubectl.get("deployment", "churn", namespace)
    pods_before = sorted(
        p["metadata"]["uid"] for p in kubectl.get("pods", namespace=namespace, **{"cpullm.io/service": "churn"})
    )

    def eligible(expected: list[str]) -> None:
        def probe() -> bool:
            plan = ready(kubectl, namespace, "churn", 1)["status"]["plan"]
            assert plan["eligibleNodes"] == sorted(expected), plan["eligibleNodes"]
            return True

        eventually(probe, timeout=60, what=f"re-planned on {expected}")

    def untouched() -> None:
        deploy = kubectl.get("deployment", "churn", namespace)
        assert deploy["metadata"]["generation"] == before["metadata"]["generation"]
        assert deploy["spec"]["template"] == before["spec"]["template"]
        pods = kubectl.get("pods", namespace=namespace, **{"cpullm.io/service": "churn"})
        assert sorted(p["metadata"]["uid"] for p in pods) == pods_before

    same_shape = fake_node(f"churn-b-{namespace[-5:]}", numa=2, pool=namespace)
    nodes.add(same_shape)
    eligible([first["metadata"]["name"], same_shape["metadata"]["name"]])
    untouched()
    kubectl.run("delete", "node", same_shape["metadata"]["name"])
    eligible([first["metadata"]["name"]])
    untouched()
    # Another shape (1 NUMA node): the 2-NUMA plan is still preferred, so nothing changes at all.
    nodes.add(fake_node(f"churn-c-{namespace[-5:]}", numa=1, pool=namespace))
    kubectl.run(
        "label", "node", first["metadata"]["name"], f"churn-seen={namespace[-5:]}"
    )  # a label nothing selects on
    eligible([first["metadata"]["name"]])
    untouched()


def unschedulable_message(kubectl: Kubectl, namespace: str, name: str) -> str:
    """The service's Ready message once it is False for a pod the scheduler cannot place."""

    def unschedulable() -> dict[str, Any]:
        found = conditions(kubectl.get("cpullm", name, namespace)).get("Ready", {})
        assert (found.get("status"), found.get("reason")) == ("False", "Unschedulable"), found
        return found

    return str(eventually(unschedulable, timeout=90, what="Ready=False Unschedulable")["message"])


def test_a_pod_the_scheduler_cannot_place_says_why_in_ready(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    """The plan fits a node, but two replicas do not fit the one node there is: the second pod stays Pending and
    the scheduler's reason reaches the service's Ready condition, not just "1/2 replicas ready"."""
    nodes.add(fake_node(f"tight-{namespace[-5:]}", numa=1, cpu="8", memory="64Gi", pool=namespace))
    service = tiny_service("tight", namespace, nodeSelector={"pool": namespace}, cpu={"cpusPerRank": 5}, replicas=2)
    kubectl.apply(service)
    message = unschedulable_message(kubectl, namespace, "tight")
    assert "/2 replicas ready; a pod cannot be scheduled: 0/" in message and "Insufficient cpu" in message
    kubectl.run("scale", "cpullm", "tight", "-n", namespace, "--replicas=1")
    ready(kubectl, namespace, "tight", 1)


def test_a_pod_with_a_servers_labels_but_not_its_replicaset_says_nothing_in_ready(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    """Anyone who may create pods in the namespace can copy a server's labels. A pod made so, which the scheduler
    cannot place, is not the service's: the operator reads a pod's facts only through the ReplicaSets of the
    service's own Deployment, so Ready stays as the servers make it, through a reconcile made after it."""
    nodes.add(fake_node(f"forged-{namespace[-5:]}", numa=1, pool=namespace))
    kubectl.apply(tiny_service("forged", namespace, nodeSelector={"pool": namespace}))
    ready(kubectl, namespace, "forged", 1)
    (server,) = kubectl.get("pods", namespace=namespace, **{"cpullm.io/service": "forged"})
    # Every label but the ReplicaSet's own pod-template-hash, by which the ReplicaSet would adopt the pod (and, one
    # pod too many, delete it).
    labels = {k: v for k, v in server["metadata"]["labels"].items() if k != "pod-template-hash"}
    forged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "forged-0", "namespace": namespace, "labels": labels},
        "spec": {"nodeSelector": {"pool": "nowhere"}, "containers": [{"name": "vllm", "image": "forged:1"}]},
    }
    kubectl.apply(forged)

    def refused_by_the_scheduler() -> bool:
        pod = kubectl.get("pod", "forged-0", namespace)
        scheduled = {c["type"]: c for c in pod.get("status", {}).get("conditions") or []}.get("PodScheduled", {})
        return scheduled.get("reason") == "Unschedulable"

    eventually(refused_by_the_scheduler, timeout=60, what="the forged pod Unschedulable")
    # And whatever its status says: here, as a server's would after an end that reported a fix the plan counts on as
    # not loaded (a server pod's, FixesLoaded=False; set as an administrator: no kubelet runs this pod).
    credited = kubectl.get("cpullm", "forged", namespace)["status"]["plan"]["fixesCredited"]
    assert credited, "the plan counts on no fix here: nothing to forge"
    ended = {"exitCode": 1, "reason": "Error", "message": f"cpullm-vllm-fix {credited[0]} nothing-to-patch\n"}
    vllm = {"name": "vllm", "ready": False, "restartCount": 1, "image": "forged:1", "imageID": ""}
    vllm |= {"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": ended}}
    kubectl.run(
        "patch", "pod", "forged-0", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"containerStatuses": [vllm]}}),
    )  # fmt: skip
    # A reconcile made while the forged pod is there (a spec change), which reads the pod indexes: Ready, and no
    # FixesLoaded condition (a label-matched pod would have put its end there).
    kubectl.run("scale", "cpullm", "forged", "-n", namespace, "--replicas=2")
    found = ready(kubectl, namespace, "forged", 2)
    assert "FixesLoaded" not in conditions(found), conditions(found).get("FixesLoaded")


def test_a_model_cache_the_nodes_disk_cannot_hold_is_unschedulable_until_it_fits(
    kubectl: Kubectl, operator: Operator | InClusterOperator, namespace: str, nodes: NodePool
):
    """The model cache's emptyDir limit is the pod's ephemeral-storage request: on a node with 20Gi of ephemeral
    storage a 50Gi cache is the scheduler's refusal, said in Ready; a cache that fits is served."""
    nodes.add(fake_node(f"small-disk-{namespace[-5:]}", numa=1, disk="20Gi", pool=namespace))
    service = tiny_service(
        "disk", namespace, nodeSelector={"pool": namespace}, modelCache={"emptyDir": {"sizeLimit": "50Gi"}}
    )
    kubectl.apply(service)
    message = unschedulable_message(kubectl, namespace, "disk")
    assert "Insufficient ephemeral-storage" in message, message
    service["spec"]["modelCache"] = {"emptyDir": {"sizeLimit": "10Gi"}}
    kubectl.apply(service)
    ready(kubectl, namespace, "disk", 1)
