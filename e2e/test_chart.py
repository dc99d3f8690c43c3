"""The Helm chart and plain manifests against a real API server: lint, server-side validation, install,
RBAC that suffices (the operator runs with the chart's ServiceAccount token) and that is needed, upgrade,
uninstall."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from testbed.cluster import tool_dirs
from testbed.objects import tiny_service
from testbed.operator import InClusterOperator, Operator
from testbed.tools import ROOT, Kubectl, eventually, free_port

from e2e.support import CHART, LOCAL_IMAGE, RELEASE, RELEASE_NAMESPACE, Helm, conditions, ready

DIGEST = "sha256:" + "ab" * 32
PROBES = "probe.nodes[0].name=n1,probe.nodes[1].name=g1,probe.nodes[1].arch=arm64"


@pytest.fixture(scope="module")
def helm(kubectl: Kubectl) -> Helm:
    return Helm(tool_dirs(["helm"])["helm"] / "helm", kubectl.kubeconfig)


def objects(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def test_helm_lint(helm: Helm):
    for values in (
        [],
        ["--set", "watchNamespaces={a,b}"],
        ["--set", "replicas=2,peering.enabled=true"],
        ["--set", "writePolicy.enabled=false"],
        ["--set", "writePolicy.protectedNamespaces={ops},writePolicy.protectReleaseNamespace=false"],
        ["--set", f"image.digest={DIGEST},vllm.images.amd64=registry.corp/vllm@{DIGEST}"],
        ["--set", PROBES],
        ["--set", MONITORING],
    ):
        helm.run("lint", "--strict", str(CHART), *LOCAL_IMAGE, *values)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param((), id="the-defaults"),
        pytest.param(("--set", "image.repository=docker.io/library/cpullm-operator"), id="the-default-spelt-whole"),
        pytest.param(("--set", f"image.digest={DIGEST}"), id="the-default-by-a-digest"),
    ],
)
def test_the_charts_unpublished_default_image_is_refused_at_install_with_the_fix(helm: Helm, values: tuple[str, ...]):
    """No operator image is published under the chart's default name, so an install naming it fails at once, saying
    how to name a build (pushed to a registry, or loaded into every node with pullPolicy Never), not later as a pod
    in ImagePullBackOff; a build loaded into the nodes, or one in a registry, installs."""
    refused = helm.run("template", RELEASE, str(CHART), *values, check=False)
    assert refused.returncode != 0, "rendered"
    assert "no image of that name is published" in refused.stderr, refused.stderr
    assert "set image.repository=REGISTRY/cpullm-operator" in refused.stderr
    assert "set image.pullPolicy=Never" in refused.stderr
    for admitted in ("image.pullPolicy=Never", "image.repository=registry.corp/cpullm-operator"):
        helm.run("template", RELEASE, str(CHART), *values, "--set", admitted)


def test_values_are_validated(helm: Helm):
    bad = helm.run("template", RELEASE, str(CHART), *LOCAL_IMAGE, "--set", "logLevel=loud", check=False)
    assert bad.returncode != 0 and "logLevel" in bad.stderr
    two = helm.run("template", RELEASE, str(CHART), *LOCAL_IMAGE, "--set", "replicas=2", check=False)
    assert two.returncode != 0 and "replicas > 1 needs peering.enabled=true" in two.stderr

    def refusal(values: str) -> str:
        result = helm.run(
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            RELEASE_NAMESPACE,
            *LOCAL_IMAGE,
            "--set",
            values,
            check=False,
        )
        assert result.returncode != 0, f"{values} rendered"
        return result.stderr

    bad = refusal("writePolicy.protectedNamespaces={Kube_System}")
    assert "at '/writePolicy/protectedNamespaces/0': 'Kube_System' does not match pattern" in bad
    assert "at '/image/digest': 'sha256:abc' does not match pattern" in refusal("image.digest=sha256:abc")
    assert "at '/image/digest'" in refusal(f"image.digest={DIGEST.upper()}")
    assert "additional properties 's390x' not allowed" in refusal("vllm.images.s390x=registry.corp/vllm:1")
    assert "at '/probe/nodes/0/name': 'Node_A' does not match pattern" in refusal("probe.nodes[0].name=Node_A")
    assert "at '/probe/nodes/0/arch'" in refusal("probe.nodes[0].name=n1,probe.nodes[0].arch=s390x")
    assert "at '/vllm/images/amd64': 'registry.corp/vllm 1' does not match" in refusal(
        "vllm.images.amd64=registry.corp/vllm 1"
    )
    # A served namespace where the write policy would let the operator write nothing is refused at install.
    for watched in ("kube-public", RELEASE_NAMESPACE):
        message = f"watchNamespaces names {watched}, where writePolicy lets the operator write nothing"
        assert message in refusal(f"watchNamespaces={{{watched}}}")
    helm.template("--set", f"watchNamespaces={{{RELEASE_NAMESPACE}}},writePolicy.protectReleaseNamespace=false")


@pytest.mark.parametrize(
    "values",
    [[], ["--set", "watchNamespaces={team-a,team-b}"], ["--set", PROBES]],
    ids=["clusterwide", "namespaced", "probes"],
)
def test_rendered_chart_validates_on_the_api_server(helm: Helm, kubectl: Kubectl, cluster_ready: Kubectl, values):
    for namespace in (RELEASE_NAMESPACE, "team-a", "team-b"):
        kubectl.run("create", "namespace", namespace, check=False)
    result = kubectl.run("apply", "--dry-run=server", "-f", "-", input=helm.template(*values))
    assert "deployment.apps/cpullm-cpullm-operator created (server dry run)" in result.stdout


def test_the_probe_jobs_run_each_nodes_vllm_image_and_only_their_publisher_holds_a_token(helm: Helm):
    """One Job per probe.nodes entry, pinned to its node by name, the vLLM image of its arch (its own, the chart's
    vllm.images, or the published one); the ServiceAccount token goes to the container that publishes alone, the
    pods are no pods the operator's selector picks, and a Job's name changes with what it runs (a Job's template
    cannot change)."""
    arm = f"registry.corp/vllm@{DIGEST}"
    rendered = objects(helm.template("--set", f"{PROBES},vllm.images.arm64={arm}"))
    jobs = {o["metadata"]["annotations"]["cpullm.io/probed-node"]: o for o in rendered if o["kind"] == "Job"}
    assert set(jobs) == {"n1", "g1"}
    images = {node: job["spec"]["template"]["spec"]["initContainers"][1]["image"] for node, job in jobs.items()}
    assert images == {"n1": "docker.io/vllm/vllm-openai-cpu:v0.32.0-x86_64", "g1": arm}
    pod = jobs["n1"]["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert pod["automountServiceAccountToken"] is False
    mounting = [
        c["name"] for c in pod["initContainers"] + pod["containers"] for m in c["volumeMounts"] if m["name"] == "token"
    ]
    assert mounting == ["publish"]
    assert "resources" not in pod["containers"][0] and "cpu" not in pod["initContainers"][1]["resources"]["limits"]
    deployment = next(o for o in rendered if o["kind"] == "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = jobs["n1"]["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in selector.items())
    (role,) = [o for o in rendered if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-probe")]
    assert role["rules"] == [
        {"apiGroups": ["cpullm.io"], "resources": ["nodeperformances"], "verbs": ["create", "patch"]}
    ]
    slower = objects(helm.template("--set", f"{PROBES},probe.secondsPerPoint=2"))
    renamed = {o["metadata"]["name"] for o in slower if o["kind"] == "Job"}
    assert renamed.isdisjoint(job["metadata"]["name"] for job in jobs.values())


MONITORING = "monitoring.dashboard.enabled=true,monitoring.alerts.enabled=true,metrics.serviceMonitor.enabled=true"


def test_the_dashboard_and_alert_rules_are_the_charts_files_as_they_are(helm: Helm):
    """monitoring.*: the ConfigMap holds files/dashboard.json and the PrometheusRule files/alerts.yaml unchanged (their
    {{ $labels }} are Prometheus', not Helm's), and the operator's ServiceMonitor keeps its series' own namespace and
    service labels, which the dashboard and the rules join on."""
    rendered = objects(helm.template("--set", MONITORING, "--set", "monitoring.alerts.labels.release=kps"))
    files = CHART / "files"
    (dashboard,) = [o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["cpullm-services.json"]) == json.loads((files / "dashboard.json").read_text())
    (rule,) = [o for o in rendered if o["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load((files / "alerts.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "kps"
    (monitor,) = [o for o in rendered if o["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert not [o for o in objects(helm.template()) if o["kind"] == "PrometheusRule"]  # off by default


def test_peering_renders_its_object_and_flag(helm: Helm):
    rendered = objects(helm.template("--set", "replicas=2,peering.enabled=true"))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    assert ("ClusterKopfPeering", "cpullm-operator") in kinds
    deploy = next(o for o in rendered if o["kind"] == "Deployment")
    assert "--peering=cpullm-operator" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "strategy" not in deploy["spec"]  # peers may overlap during a rollout: only one is active


APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


@pytest.mark.parametrize(
    ("values", "image", "vllm_images"),
    [
        pytest.param("", f"cpullm-operator:{APP_VERSION}", None, id="defaults-the-appversion-no-vllm-images"),
        pytest.param("image.tag=0.0.9", "cpullm-operator:0.0.9", None, id="a-tag"),
        pytest.param(
            f"image.repository=registry.corp/cpullm,image.tag=0.0.9,image.digest={DIGEST}",
            f"registry.corp/cpullm@{DIGEST}",
            None,
            id="the-digest-wins-over-the-tag",
        ),
        pytest.param(
            f"vllm.images.arm64=registry.corp/vllm@{DIGEST}",
            f"cpullm-operator:{APP_VERSION}",
            {"arm64": f"registry.corp/vllm@{DIGEST}"},
            id="one-arch-pinned",
        ),
        pytest.param(
            "vllm.images.amd64=registry.corp/vllm:x86,vllm.images.arm64=registry.corp/vllm:arm",
            f"cpullm-operator:{APP_VERSION}",
            {"amd64": "registry.corp/vllm:x86", "arm64": "registry.corp/vllm:arm"},
            id="both-arches",
        ),
    ],
)
def test_the_operator_image_and_the_vllm_images_the_chart_installs(
    helm: Helm, values: str, image: str, vllm_images: dict[str, str] | None
):
    """The operator runs repository@digest when image.digest is set, else repository:tag (the appVersion by
    default); vllm.images reaches the operator as CPULLM_VLLM_IMAGES (JSON, only the arches set), and without any the
    variable is absent, so the operator renders the servers as before."""
    rendered = objects(helm.template(*(["--set", values] if values else [])))
    deploy = next(o for o in rendered if o["kind"] == "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (json.loads(env["CPULLM_VLLM_IMAGES"]) if "CPULLM_VLLM_IMAGES" in env else None) == vllm_images


def test_install_yaml_is_rendered_from_the_chart(tmp_path: Path):
    expected = (ROOT / "manifests" / "install.yaml").read_text()
    subprocess.run(["bash", str(ROOT / "scripts" / "render-install.sh")], check=True, capture_output=True)
    assert (ROOT / "manifests" / "install.yaml").read_text() == expected, "run scripts/render-install.sh"


def test_examples_validate_against_the_installed_crd(kubectl: Kubectl, cluster_ready: Kubectl):
    result = kubectl.run("apply", "--dry-run=server", "-f", str(ROOT / "manifests" / "examples"))
    assert result.stdout.count("created (server dry run)") == len(
        list((ROOT / "manifests" / "examples").glob("*.yaml"))
    )


def service_account_kubeconfig(kubectl: Kubectl, path: Path, release: str = RELEASE) -> str:
    """A kubeconfig that authenticates as the chart's ServiceAccount (a TokenRequest token)."""
    account = f"{release}-cpullm-operator"
    token = kubectl.run("create", "token", account, "-n", RELEASE_NAMESPACE, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(kubectl.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "clusters": [{"name": "c", "cluster": cluster["cluster"]}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture
def chart_only(operator: Operator | InClusterOperator) -> Iterator[None]:
    """The suite's admin-credentialed operator stands down while the chart's identity does the work."""
    operator.stop()
    yield
    operator.start()


def test_install_rbac_suffices_and_is_needed_then_upgrade_and_uninstall(
    helm: Helm, kubectl: Kubectl, cluster_ready: Kubectl, chart_only: None, workdir: Path
):
    namespace = f"e2e-chart-{uuid.uuid4().hex[:5]}"
    kubectl.run("create", "namespace", namespace)
    helm.run("install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace", *LOCAL_IMAGE)
    write_policy_enforced(kubectl, RELEASE)  # the operator below works under it
    as_chart = Operator(
        service_account_kubeconfig(kubectl, workdir / "sa.kubeconfig"), workdir / "chart-operator.log", free_port()
    )
    as_chart.start()
    try:
        kubectl.apply(tiny_service("rbac-ok", namespace))
        ready(kubectl, namespace, "rbac-ok", 1)

        # Take away one rule the code needs: applying ConfigMaps.
        role = kubectl.get("clusterrole", "cpullm-cpullm-operator")
        index = next(i for i, rule in enumerate(role["rules"]) if rule["resources"] == ["configmaps"])
        kubectl.run(
            "patch",
            "clusterrole",
            "cpullm-cpullm-operator",
            "--type=json",
            "-p",
            json.dumps([{"op": "remove", "path": f"/rules/{index}"}]),
        )
        kubectl.apply(tiny_service("rbac-missing", namespace))

        def permission_problem() -> str:
            planned = conditions(kubectl.get("cpullm", "rbac-missing", namespace)).get("Planned", {})
            assert planned.get("reason") == "PermissionDenied", planned
            return str(planned["message"])

        message = eventually(permission_problem, timeout=60, what="PermissionDenied condition")
        # The first call the rule grants: the ConfigMap's first write, a create (controller/owned.py).
        assert "forbidden to apply ConfigMap" in message
    finally:
        as_chart.stop()

    helm.run(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        *LOCAL_IMAGE,
        "--set",
        f"logLevel=debug,watchNamespaces={{{namespace}}}",
    )
    args = kubectl.get("deployment", "cpullm-cpullm-operator", RELEASE_NAMESPACE)["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert f"--namespace={namespace}" in args and "--verbose" in args
    assert kubectl.get("role", "cpullm-cpullm-operator", namespace) is not None
    assert kubectl.get("clusterrole", "cpullm-cpullm-operator") is None  # namespaced rules moved to the Role

    helm.run("uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait")
    left = [
        kubectl.get(kind, namespace=ns, **{"app.kubernetes.io/instance": RELEASE})
        for kind, ns in [
            ("deploy,sa,role,rolebinding", RELEASE_NAMESPACE),
            ("role,rolebinding", namespace),
            ("clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding", None),
        ]
    ]
    assert left == [[], [], []]
    assert kubectl.get("crd", "cpullmservices.cpullm.io") is not None  # Helm never deletes chart CRDs
    kubectl.run("delete", "namespace", namespace, "--wait=false")


def test_peering_mode_runs_with_the_charts_rbac(
    helm: Helm, kubectl: Kubectl, cluster_ready: Kubectl, chart_only: None, workdir: Path
):
    release, namespace = "peered", f"e2e-peering-{uuid.uuid4().hex[:5]}"
    kubectl.run("create", "namespace", namespace)
    helm.run(
        "install",
        release,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        *LOCAL_IMAGE,
        "--set",
        "replicas=2,peering.enabled=true",
    )
    kubeconfig = service_account_kubeconfig(kubectl, workdir / "peer.kubeconfig", release)
    peer = Operator(kubeconfig, workdir / "peer-operator.log", free_port(), extra_args=["--peering", "cpullm-operator"])
    peer.start()
    try:
        kubectl.apply(tiny_service("peered", namespace))
        ready(kubectl, namespace, "peered", 1)
        peering = kubectl.get("clusterkopfpeering", "cpullm-operator")
        assert peering.get("status"), "the operator did not announce itself in the peering object"
        assert "forbidden" not in peer.log_tail(200).lower()
    finally:
        peer.stop()
        helm.run("uninstall", release, "--namespace", RELEASE_NAMESPACE, "--wait")
        kubectl.run("delete", "namespace", namespace, "--wait=false")


def operator_account(release: str) -> str:
    """The username the API server gives the release's operator (its ServiceAccount)."""
    return f"system:serviceaccount:{RELEASE_NAMESPACE}:{release}-cpullm-operator"


def write_policy_enforced(kubectl: Kubectl, release: str) -> None:
    """Until the API server enforces the release's write policy (it does a moment after the policy and its binding
    are made): the operator's ServiceAccount, which RBAC lets write ConfigMaps everywhere, is refused one in
    kube-system."""

    def refused() -> bool:
        args = ("create", "configmap", "probe", "-n", "kube-system", "--dry-run=server")
        result = kubectl.run(f"--as={operator_account(release)}", *args, check=False)
        assert "may not write in namespace kube-system" in result.stderr, result.stderr or result.stdout
        return True

    eventually(refused, timeout=60, what=f"the write policy of release {release} enforced")


GUARDED = "guarded"  # the release whose write policy the tests below exercise (RELEASE comes and goes above)
MANAGED_BY = "app.kubernetes.io/managed-by=cpullm-operator"


def child_config_map(name: str, namespace: str, owner: dict[str, Any] | None, **data: str) -> dict[str, Any]:
    """A ConfigMap shaped like the operator's children: its label, and a controller reference to `owner` (a
    CpuLLMService as stored) unless None."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict([MANAGED_BY.split("=")])}
    if owner is not None:
        ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"]}
        meta["ownerReferences"] = [{**ref, "uid": owner["metadata"]["uid"], "controller": True}]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data or {"k": "v"}}


@pytest.fixture(scope="module")
def policed(helm: Helm, kubectl: Kubectl, cluster_ready: Kubectl) -> Iterator[dict[str, Any]]:
    """The chart installed with its policies on, enforced (and a node cache directory and an image allowlist for
    its pods policy to check: ALLOWED, as the allowlist's own tests install it, so both agree), and a tenant
    namespace holding a ConfigMap and a Deployment the operator did not make, a ConfigMap labelled as its own but
    controlled by nothing, and a child of a CpuLLMService there (`owner`, as stored)."""
    tenant = f"e2e-policed-{uuid.uuid4().hex[:5]}"
    kubectl.run("create", "namespace", tenant)
    values = f"nodeCacheDir={CACHE_DIR},imageAllowlist.enabled=true,imageAllowlist.prefixes={{{','.join(ALLOWED)}}}"
    helm.run(
        "install",
        GUARDED,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        *LOCAL_IMAGE,
        "--set",
        values,
    )
    try:
        policy = kubectl.get("validatingadmissionpolicy", f"{GUARDED}-cpullm-operator-writes")
        assert policy["spec"]["failurePolicy"] == "Fail"
        binding = kubectl.get("validatingadmissionpolicybinding", f"{GUARDED}-cpullm-operator-writes")
        assert binding["spec"]["validationActions"] == ["Deny"]
        kubectl.apply(tiny_service("owner", tenant, replicas=0))
        owner = kubectl.get("cpullm", "owner", tenant)
        idle = {"replicas": 0, "selector": {"matchLabels": {"app": "idle"}}}
        idle["template"] = {
            "metadata": {"labels": {"app": "idle"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        kubectl.apply(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plain", "namespace": tenant}},
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "plain", "namespace": tenant},
                "spec": idle,
            },
            child_config_map("labelled", tenant, None),
            child_config_map("child", tenant, owner),
        )
        write_policy_enforced(kubectl, GUARDED)
        for name in ("children", "pods"):
            checked = kubectl.get("validatingadmissionpolicy", f"{GUARDED}-cpullm-operator-{name}")["status"]
            assert not checked.get("typeChecking", {}).get("expressionWarnings"), checked
        # Type-checked against the matched kinds' schemas without a warning (a misspelt field would be one).
        checked = kubectl.get("validatingadmissionpolicy", f"{GUARDED}-cpullm-operator-writes")["status"]
        assert not checked.get("typeChecking", {}).get("expressionWarnings"), checked
        yield {"tenant": tenant, "owner": owner}
    finally:
        helm.run("uninstall", GUARDED, "--namespace", RELEASE_NAMESPACE, "--wait")
        kubectl.run("delete", "namespace", tenant, "--wait=false")


REFUSED_CHANGE = "the cpullm-operator may change only its own children"


@pytest.mark.parametrize(
    ("where", "args", "body", "refused"),
    [
        pytest.param("tenant", ("delete", "configmap", "plain"), None, "may delete only its own", id="delete-another"),
        pytest.param(
            "tenant", ("delete", "deployment", "plain"), None, "may delete only its own", id="delete-a-deploy"
        ),
        pytest.param("tenant", ("label", "configmap", "plain", MANAGED_BY), None, REFUSED_CHANGE, id="take-over"),
        pytest.param(
            "tenant", ("patch", "configmap", "plain", "-p", '{"data":{"k":"x"}}'), None, REFUSED_CHANGE, id="change"
        ),
        pytest.param("tenant", ("create", "configmap", "made"), None, "may create only its own", id="create-another"),
        pytest.param("tenant", ("delete", "configmap", "labelled"), None, "may delete only its own", id="label-only"),
        pytest.param(
            "tenant",
            ("label", "configmap", "child", "app.kubernetes.io/managed-by-"),
            None,
            "may leave only its own children (labelled app.kubernetes.io/managed-by=cpullm-operator, controlled by a"
            " CpuLLMService or CpuLLMGateway): configmaps {tenant}/child would not be one",
            id="relabel-a-child-away",
        ),
        pytest.param(
            "kube-system",
            ("delete", "configmap", "extension-apiserver-authentication"),
            None,
            "may not write in namespace kube-system",
            id="delete-in-kube-system",
        ),
        pytest.param(
            "kube-system",
            (),
            "child",
            "may not write in namespace kube-system (configmaps kube-system/made):"
            " its write policy protects kube-system, kube-public, kube-node-lease, cpullm-system",
            id="apply-in-kube-system",
        ),
        pytest.param(
            RELEASE_NAMESPACE,
            (),
            "child",
            f"may not write in namespace {RELEASE_NAMESPACE}",
            id="apply-in-its-own-namespace",
        ),
        # What it does write: its children (server-side apply creates and changes them), Events anywhere.
        pytest.param("tenant", (), "child", None, id="apply-a-new-child"),
        pytest.param("tenant", (), "changed-child", None, id="apply-over-a-child"),
        pytest.param(
            "tenant", ("patch", "configmap", "child", "-p", '{"data":{"k":"x"}}'), None, None, id="patch-a-child"
        ),
        pytest.param("tenant", ("delete", "configmap", "child"), None, None, id="delete-a-child"),
        pytest.param("kube-system", ("create", "-f", "-"), "event", None, id="an-event-in-kube-system"),
    ],
)
def test_the_write_policy_confines_the_operators_writes_to_its_children(
    kubectl: Kubectl, policed: dict[str, Any], where: str, args: tuple[str, ...], body: str | None, refused: str | None
):
    """Requests as the operator's ServiceAccount (impersonated; RBAC allows every one of them), dry runs: the policy
    refuses what is not the operator's child, and anything in a protected namespace, with a message that says so."""
    namespace = policed["tenant"] if where == "tenant" else where
    manifest: dict[str, Any] | None = None
    if body in ("child", "changed-child"):  # server-side apply of a child: a new one, or over the existing one
        name, data = ("made", {}) if body == "child" else ("child", {"k": "changed"})
        manifest = child_config_map(name, namespace, policed["owner"], **data)
        args = ("apply", "--server-side", "--force-conflicts", "--field-manager=cpullm-operator", "-f", "-")
    elif body == "event":
        regarding = {"kind": "Pod", "name": "p", "namespace": namespace}
        manifest = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "probe."},
            "involvedObject": regarding,
        }
        manifest.update(reason="Probe", message="an event", type="Normal")
    stdin = yaml.safe_dump(manifest) if manifest else None
    dry_run_here = ("-n", namespace, "--dry-run=server")
    result = kubectl.run(*args, *dry_run_here, f"--as={operator_account(GUARDED)}", input=stdin, check=False)
    if refused is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0, result.stdout
        assert f"ValidatingAdmissionPolicy '{GUARDED}-cpullm-operator-writes'" in result.stderr
        assert refused.format(tenant=namespace) in result.stderr
        # Only the operator's requests are matched: an admin may do the same.
        if manifest is None and args[0] in ("delete", "label", "patch"):
            assert kubectl.run(*args, *dry_run_here).returncode == 0


def test_the_operator_serves_under_its_write_policy(
    kubectl: Kubectl, policed: dict[str, Any], chart_only: None, workdir: Path
):
    """The operator, as the guarded release's ServiceAccount, with the policy enforced: it creates its children,
    reverts drift in them (server-side apply over them: updates), and deletes the budget a service no longer needs.
    A child someone relabelled away is no longer its own (a PermissionDenied condition naming the policy, until the
    label is back), and a service in a protected namespace gets the same condition."""
    tenant = policed["tenant"]
    as_chart = Operator(
        service_account_kubeconfig(kubectl, workdir / "guarded.kubeconfig", GUARDED),
        workdir / "guarded-operator.log",
        free_port(),
    )
    as_chart.start()
    try:
        kubectl.apply(tiny_service("served", tenant, replicas=2))
        ready(kubectl, tenant, "served", 2)
        assert kubectl.get("poddisruptionbudget", "served", tenant) is not None
        kubectl.run("scale", "deployment", "served", "-n", tenant, "--replicas=3")
        eventually(
            lambda: kubectl.get("deployment", "served", tenant)["spec"]["replicas"] == 2, what="the drift reverted"
        )
        kubectl.apply(tiny_service("served", tenant, replicas=1))
        ready(kubectl, tenant, "served", 1)
        eventually(lambda: kubectl.get("poddisruptionbudget", "served", tenant) is None, what="the budget deleted")

        def denied(namespace: str, name: str, message: str) -> bool:
            planned = conditions(kubectl.get("cpullm", name, namespace)).get("Planned", {})
            assert planned.get("reason") == "PermissionDenied", planned
            assert f"ValidatingAdmissionPolicy '{GUARDED}-cpullm-operator-writes'" in planned["message"], planned
            assert message in planned["message"], planned
            return True

        kubectl.run("label", "service", "served", "-n", tenant, "app.kubernetes.io/managed-by-")
        kubectl.run("patch", "service", "served", "-n", tenant, "-p", '{"spec":{"selector":{"app":"elsewhere"}}}')
        relabelled = (
            f"{REFUSED_CHANGE} (labelled {MANAGED_BY}, controlled by a CpuLLMService or CpuLLMGateway):"
            f" services {tenant}/served"
        )
        eventually(lambda: denied(tenant, "served", relabelled), timeout=60, what="the relabelled child refused")
        kubectl.run("label", "service", "served", "-n", tenant, MANAGED_BY)
        ready(kubectl, tenant, "served", 1)
        assert kubectl.get("service", "served", tenant)["spec"]["selector"] == {"cpullm.io/service": "served"}

        kubectl.apply(tiny_service("protected", RELEASE_NAMESPACE))
        where = f"may not write in namespace {RELEASE_NAMESPACE}"
        eventually(lambda: denied(RELEASE_NAMESPACE, "protected", where), timeout=60, what="the protected namespace")
    finally:
        as_chart.stop()
        kubectl.run("delete", "cpullm", "protected", "-n", RELEASE_NAMESPACE, "--ignore-not-found")


TENANT_EDITOR = "carol"  # holds the built-in edit role in the tenant namespace


@pytest.fixture(scope="module")
def editor(kubectl: Kubectl, policed: dict[str, Any]) -> str:
    """A tenant with the built-in edit role in the policed namespace (ConfigMaps, Deployments, Services: RBAC lets
    them change the operator's children there)."""
    tenant = policed["tenant"]
    binding = ("create", "rolebinding", "carol-edit", "--clusterrole=edit", f"--user={TENANT_EDITOR}", "-n", tenant)
    kubectl.run(*binding)
    return TENANT_EDITOR


CHILD_OF_OWNER = "configmaps {tenant}/child belongs to the cpullm-operator (CpuLLMService owner)"
ONLY_THE_OPERATOR = "only the cpullm-operator may {verb} objects labelled app.kubernetes.io/managed-by=cpullm-operator"


@pytest.mark.parametrize(
    ("args", "labelled", "refused"),
    [
        pytest.param(
            ("patch", "configmap", "child", "-p", '{"data":{"launch.py":"evil"}}'),
            False,
            f"{CHILD_OF_OWNER}: change the CpuLLMService instead; only the operator and Kubernetes' controllers may "
            "change it",
            id="change-a-child",
        ),
        pytest.param(
            ("delete", "configmap", "child"),
            False,
            f"{CHILD_OF_OWNER}: change the CpuLLMService instead; only the operator and Kubernetes' controllers may "
            "delete it",
            id="delete-a-child",
        ),
        pytest.param(
            ("label", "configmap", "plain", MANAGED_BY),
            False,
            ONLY_THE_OPERATOR.format(verb="make") + ": configmaps {tenant}/plain",
            id="label-one-as-a-child",
        ),
        pytest.param(
            ("create", "-f", "-"),
            True,
            ONLY_THE_OPERATOR.format(verb="create") + ": configmaps {tenant}/forged",
            id="create-a-labelled-one",
        ),
        pytest.param(("patch", "configmap", "plain", "-p", '{"data":{"k":"x"}}'), False, None, id="its-own-objects"),
    ],
)
def test_a_tenant_cannot_change_the_operators_children(
    kubectl: Kubectl,
    policed: dict[str, Any],
    editor: str,
    args: tuple[str, ...],
    labelled: bool,
    refused: str | None,
):
    """A namespace editor's requests (dry runs; RBAC allows each): the operator's children are its alone, so the
    launcher code and pod templates it rendered are what the servers run; what the tenant made stays theirs, and a
    cluster admin (system:masters) may still change a child by hand."""
    tenant = policed["tenant"]
    stdin = yaml.safe_dump(child_config_map("forged", tenant, None)) if labelled else None
    here = ("-n", tenant, "--dry-run=server")
    verb = "patch" if args[0] == "label" else args[0]
    allowed = kubectl.run("auth", "can-i", verb, "configmaps", "-n", tenant, f"--as={editor}").stdout.strip()
    assert allowed == "yes"  # RBAC allows it: only the policy can refuse
    result = kubectl.run(*args, *here, f"--as={editor}", input=stdin, check=False)
    if refused is None:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode != 0, result.stdout
    assert f"ValidatingAdmissionPolicy '{GUARDED}-cpullm-operator-children'" in result.stderr
    assert refused.format(tenant=tenant) in result.stderr, result.stderr
    assert kubectl.run(*args, *here, input=stdin).returncode == 0  # an admin may


def test_a_namespaced_release_guards_only_its_namespaces(helm: Helm):
    """So releases serving other namespaces write their own children there."""
    rendered = objects(helm.template("--set", "watchNamespaces={team-a,team-b}"))
    (policy,) = [
        o
        for o in rendered
        if o["metadata"]["name"].endswith("-children") and "spec" in o and "validations" in o["spec"]
    ]
    selector = policy["spec"]["matchConstraints"]["namespaceSelector"]
    assert selector == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]
    }
    (cluster_wide,) = [
        o
        for o in objects(helm.template())
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"].endswith("-children")
    ]
    assert "namespaceSelector" not in cluster_wide["spec"]["matchConstraints"]


def test_the_garbage_collector_still_deletes_children_with_their_service(kubectl: Kubectl, policed: dict[str, Any]):
    tenant = policed["tenant"]
    kubectl.apply(tiny_service("doomed", tenant, replicas=0))
    doomed = kubectl.get("cpullm", "doomed", tenant)
    kubectl.apply(child_config_map("doomed-child", tenant, doomed))
    kubectl.run("delete", "cpullm", "doomed", "-n", tenant)
    eventually(lambda: kubectl.get("configmap", "doomed-child", tenant) is None, what="the child garbage-collected")


# The admin's prefixes: a registry (any repository under it; another port is another registry), a repository (any
# tag of it), a Docker Hub repository by its short name, and the router pinned by digest only.
ALLOWED = ("registry.corp", "quay.io/cpullm/vllm", "vllm/vllm-openai-cpu", "docker.io/library/haproxy@")


def dry_run(kubectl: Kubectl, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """A server-side dry run: admission runs, nothing is stored."""
    return kubectl.run("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj), check=False)


@pytest.fixture(scope="module")
def allowlist_namespace(helm: Helm, kubectl: Kubectl, cluster_ready: Kubectl) -> Iterator[str]:
    """The chart's optional ValidatingAdmissionPolicy with ALLOWED, enforced: a namespace to try images in."""
    prefixes = ",".join(ALLOWED)
    rendered = objects(helm.template("--set", f"imageAllowlist.enabled=true,imageAllowlist.prefixes={{{prefixes}}}"))
    # The allowlist's policy alone: the chart's others, left installed, would fence the other releases' writes.
    policy = [o for o in rendered if o["metadata"]["name"].endswith("-image-allowlist")]
    assert sorted(o["kind"] for o in policy) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    namespace = f"e2e-allow-{uuid.uuid4().hex[:5]}"
    kubectl.run("create", "namespace", namespace)
    kubectl.apply(*policy)
    try:
        evil = tiny_service("evil", namespace, image="evil.example/miner:1")
        assert eventually(lambda: dry_run(kubectl, evil).returncode != 0, timeout=60, what="the policy enforced")
        yield namespace
    finally:
        for obj in policy:
            kubectl.run("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found")
        kubectl.run("delete", "namespace", namespace, "--wait=false")


def router(image: str | None = None) -> dict[str, Any]:
    return {"mode": "router", **({"router": {"image": image}} if image else {})}


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        pytest.param({"image": "registry.corp/vllm/cpu:1"}, None, id="under-a-prefix"),
        # Another port is another registry: allowlisted only by a prefix that names it.
        pytest.param({"image": "registry.corp:5000/vllm:1"}, "spec.image registry.corp:5000/vllm:1", id="another-port"),
        pytest.param({"image": "quay.io/cpullm/vllm:0.32"}, None, id="a-tag-of-a-repository"),
        pytest.param(
            {"image": "quay.io/cpullm/vllm-x:1"}, "spec.image quay.io/cpullm/vllm-x:1", id="a-longer-repository"
        ),
        pytest.param({"image": "registry.corp.evil.net/x"}, "spec.image registry.corp.evil.net/x", id="no-boundary"),
        pytest.param({"image": "registry.corpx/vllm:1"}, "spec.image registry.corpx/vllm:1", id="a-longer-name"),
        pytest.param({}, None, id="images-unset"),
        pytest.param({"routing": router()}, None, id="router-image-unset"),
        pytest.param({"routing": router(f"docker.io/library/haproxy@{DIGEST}")}, None, id="router-by-digest"),
        pytest.param({"routing": router("registry.corp/haproxy:3.2")}, None, id="router-under-a-prefix"),
        pytest.param(
            {"routing": router("docker.io/library/haproxy:3.2")},
            "spec.routing.router.image docker.io/library/haproxy:3.2",
            id="router-by-tag-refused",
        ),
        # Docker Hub's names compare as Docker reads them, short or whole, prefix and image alike.
        pytest.param({"image": "docker.io/vllm/vllm-openai-cpu:v0.32.0-x86_64"}, None, id="hub-whole-under-short"),
        pytest.param({"image": "index.docker.io/vllm/vllm-openai-cpu:v1"}, None, id="hub-index-host"),
        pytest.param({"image": "vllm/vllm-openai-cpu@" + DIGEST}, None, id="hub-short-by-digest"),
        pytest.param(
            {"image": "vllm/vllm-openai-cpu-x:1"}, "spec.image vllm/vllm-openai-cpu-x:1", id="hub-a-longer-repository"
        ),
        pytest.param({"image": "evil/vllm-openai-cpu:1"}, "spec.image evil/vllm-openai-cpu:1", id="hub-another-org"),
        pytest.param({"routing": router(f"haproxy@{DIGEST}")}, None, id="hub-library-short-by-digest"),
        pytest.param({"routing": router(f"docker.io/haproxy@{DIGEST}")}, None, id="hub-library-implied"),
        pytest.param(
            {"routing": router("haproxy:3.2")}, "spec.routing.router.image haproxy:3.2", id="hub-library-by-tag-refused"
        ),
        pytest.param(
            {"image": "registry.corp/vllm:1", "routing": router("evil.example/haproxy:3")},
            "spec.routing.router.image evil.example/haproxy:3",
            id="only-the-refused-field-named",
        ),
        pytest.param(
            {"image": "evil.example/vllm:1", "routing": router("evil.example/haproxy:3")},
            "spec.image evil.example/vllm:1, spec.routing.router.image evil.example/haproxy:3",
            id="both-refused",
        ),
    ],
)
def test_the_image_allowlist_checks_every_image_field_at_a_boundary(
    kubectl: Kubectl, allowlist_namespace: str, spec: dict[str, Any], refused: str | None
):
    """The policy on the real API server: each image field of the spec matches a prefix only where the prefix
    ends or the image goes on with '/', ':' or '@'; an unset image is the operator's own. The message names the
    refused fields with their images, and the prefixes."""
    result = dry_run(kubectl, tiny_service("images", allowlist_namespace, **spec))
    if refused is None:
        assert result.returncode == 0, result.stderr
    else:
        assert f"not allowed here: {refused}; images must be one of these prefixes" in result.stderr
        assert result.stderr.rstrip().endswith(", ".join(ALLOWED))


def test_the_operator_pod_meets_the_pod_security_level_its_namespace_enforces(kubectl: Kubectl, cluster_ready: Kubectl):
    """manifests/install.yaml's namespace enforces Pod Security restricted; the operator's pod, as the chart
    renders it, is admitted there, and a pod without its security context is not (Pod Security admission on the
    real API server)."""
    install = objects((ROOT / "manifests" / "install.yaml").read_text())
    (labels,) = [o["metadata"]["labels"] for o in install if o["kind"] == "Namespace"]
    assert labels == {"pod-security.kubernetes.io/enforce": "restricted"}
    (deployment,) = [o for o in install if o["kind"] == "Deployment"]
    pod_spec = deployment["spec"]["template"]["spec"]
    namespace = f"e2e-psa-{uuid.uuid4().hex[:5]}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}})
    account = {"apiVersion": "v1", "kind": "ServiceAccount"}
    kubectl.apply({**account, "metadata": {"name": pod_spec["serviceAccountName"], "namespace": namespace}})
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator", "namespace": namespace}}
        admitted = dry_run(kubectl, {**pod, "spec": pod_spec})
        assert admitted.returncode == 0, admitted.stderr
        bare = {"containers": [{"name": "root", "image": pod_spec["containers"][0]["image"]}]}
        refused = dry_run(kubectl, {**pod, "spec": bare})
        assert 'violates PodSecurity "restricted:latest"' in refused.stderr
    finally:
        kubectl.run("delete", "namespace", namespace, "--wait=false")


def test_namespace_editors_manage_cpullmservices_and_viewers_read_them(
    helm: Helm, kubectl: Kubectl, cluster_ready: Kubectl
):
    """The chart's user roles aggregate into the built-in edit and view roles (the controller-manager's
    aggregation, on the real cluster)."""
    roles = [o for o in objects(helm.template()) if o["metadata"]["name"].endswith(("-edit", "-view"))]
    assert len(roles) == 2
    namespace = f"e2e-roles-{uuid.uuid4().hex[:5]}"
    kubectl.run("create", "namespace", namespace)
    kubectl.apply(*roles)
    try:
        for role, user in (("edit", "alice"), ("view", "bob")):
            kubectl.run(
                "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}", "-n", namespace
            )

        def can(user: str, verb: str) -> str:
            args = ("auth", "can-i", verb, "cpullmservices.cpullm.io", "-n", namespace, f"--as={user}")
            return kubectl.run(*args, check=False).stdout.strip()

        assert eventually(lambda: can("alice", "create") == "yes", what="edit aggregates the CpuLLMService rules")
        assert eventually(lambda: can("bob", "list") == "yes", what="view aggregates the CpuLLMService rules")
        assert can("bob", "create") == "no"
    finally:
        for role in roles:
            kubectl.run("delete", "clusterrole", role["metadata"]["name"], "--ignore-not-found")
        kubectl.run("delete", "namespace", namespace, "--wait=false")


CACHE_DIR = "/var/lib/cpullm"  # the guarded release's nodeCacheDir
PUBLISHED = "docker.io/vllm/vllm-openai-cpu:v0.32.0-x86_64"


def child_deployment(namespace: str, owner: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """A Deployment shaped like the operator's server: a child of `owner`, running `pod`."""
    meta = child_config_map("server", namespace, owner)["metadata"]
    template = {"metadata": {"labels": {"app": "server"}}, "spec": pod}
    spec = {"replicas": 0, "selector": {"matchLabels": {"app": "server"}}, "template": template}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def server_pod() -> dict[str, Any]:
    """What the operator renders for a server, in the parts the policy reads."""
    caps = {"drop": ["ALL"], "add": ["SYS_NICE"]}
    security = {"allowPrivilegeEscalation": False, "capabilities": caps, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"name": "vllm", "image": PUBLISHED, "securityContext": security, "ports": [{"containerPort": 8000}]}
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "launcher", "configMap": {"name": "server-launcher"}},
        {"name": "weights", "hostPath": {"path": f"{CACHE_DIR}/ns.1/m", "type": "DirectoryOrCreate"}},
        {"name": "claim", "persistentVolumeClaim": {"claimName": "models"}},
    ]
    return {"automountServiceAccountToken": False, "containers": [container], "volumes": volumes}


def changed(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Sets `value` at `path` (dots; a number indexes a list) of a pod spec."""

    def change(pod: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        here: Any = pod
        for part in parents:
            here = here[part]
        here[last] = value

    return change


UNPRIVILEGED = "containers are unprivileged, never escalate, add no capability but SYS_NICE and keep a seccomp profile"
VOLUMES = (
    "pods mount emptyDir, configMap, persistentVolumeClaim and projected Secret volumes (the team keys of a gateway),"
    f" and hostPaths under {CACHE_DIR}/"
)


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        pytest.param(changed("automountServiceAccountToken", False), None, id="a-server-as-rendered"),
        pytest.param(changed("containers.0.image", "registry.corp/vllm:1"), None, id="an-allowlisted-image"),
        pytest.param(changed("containers.0.image", "docker.io/library/haproxy:3.2"), None, id="the-default-router"),
        pytest.param(changed("containers.0.image", "vllm/vllm-openai-cpu:v9"), None, id="a-hub-short-name-allowlisted"),
        pytest.param(
            changed("containers.0.image", "evil/vllm-openai-cpu:v9"),
            "images are those of its chart",
            id="a-hub-short-name-of-no-one",
        ),
        pytest.param(changed("serviceAccountName", "admin"), "pods run as the default ServiceAccount", id="sa"),
        pytest.param(changed("automountServiceAccountToken", True), "pods mount no ServiceAccount token", id="token"),
        pytest.param(changed("hostNetwork", True), "pods use no host network, PID or IPC namespace", id="host-network"),
        pytest.param(changed("hostPID", True), "pods use no host network, PID or IPC namespace", id="host-pid"),
        pytest.param(changed("containers.0.securityContext", {"privileged": True}), UNPRIVILEGED, id="privileged"),
        pytest.param(
            changed("containers.0.securityContext.allowPrivilegeEscalation", True), UNPRIVILEGED, id="escalation"
        ),
        pytest.param(changed("containers.0.securityContext.capabilities.add", ["SYS_ADMIN"]), UNPRIVILEGED, id="cap"),
        pytest.param(
            changed("containers.0.securityContext.seccompProfile", {"type": "Unconfined"}), UNPRIVILEGED, id="seccomp"
        ),
        pytest.param(
            changed("initContainers", [{"name": "i", "image": PUBLISHED, "securityContext": {"privileged": True}}]),
            UNPRIVILEGED,
            id="a-privileged-init-container",
        ),
        pytest.param(changed("containers.0.ports.0.hostPort", 8000), "pods take no host port", id="host-port"),
        pytest.param(changed("volumes.2.hostPath.path", "/etc"), VOLUMES, id="a-host-path-elsewhere"),
        pytest.param(changed("volumes.2.hostPath.path", f"{CACHE_DIR}-x/m"), VOLUMES, id="a-host-path-beside"),
        pytest.param(changed("volumes.3", {"name": "s", "secret": {"secretName": "any"}}), VOLUMES, id="a-secret"),
        # A gateway's team keys: Secrets projected, nothing else in the projection.
        pytest.param(
            changed("volumes.3", {"name": "k", "projected": {"sources": [{"secret": {"name": "team-key"}}]}}),
            None,
            id="projected-secrets",
        ),
        pytest.param(
            changed(
                "volumes.3",
                {"name": "k", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
            ),
            VOLUMES,
            id="a-projected-token",
        ),
        pytest.param(
            changed("containers.0.image", "evil.example/miner:1"),
            f"images are those of its chart (docker.io/library/haproxy:3.2, {PUBLISHED}",
            id="an-image-of-no-one",
        ),
    ],
)
def test_the_pods_policy_refuses_a_child_deployment_that_runs_more_than_a_server_needs(
    kubectl: Kubectl, policed: dict[str, Any], change: Callable[[dict[str, Any]], None], refused: str | None
):
    """Server-side dry runs of child Deployments as the operator's ServiceAccount: what a server or a router needs
    passes; anything more is refused with what the operator's pods may hold, whatever wrote it."""
    pod = server_pod()
    change(pod)
    deployment = child_deployment(policed["tenant"], policed["owner"], pod)
    args = ("apply", "--server-side", "--field-manager=cpullm-operator", "-f", "-", "--dry-run=server")
    result = kubectl.run(*args, f"--as={operator_account(GUARDED)}", input=yaml.safe_dump(deployment), check=False)
    if refused is None:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode != 0, result.stdout
    assert f"ValidatingAdmissionPolicy '{GUARDED}-cpullm-operator-pods'" in result.stderr, result.stderr
    assert f"deployments {policed['tenant']}/server: the cpullm-operator {refused}" in result.stderr, result.stderr
