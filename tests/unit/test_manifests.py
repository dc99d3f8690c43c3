from pathlib import Path

import pytest

from cpullm import api_key_guard, launcher, vllm_fixes, vllm_support
from cpullm.core.children import launcher as children_launcher
from cpullm.core.children.common import Owner, binary_quantity
from cpullm.core.children.deployment import build_deployment
from cpullm.core.children.drain import DRAIN_SCRIPT
from cpullm.core.children.launcher import build_launcher_config_map, in_pod_code_digest
from cpullm.core.children.service import build_service
from cpullm.core.constants import API_KEY_GUARD_FILE, LAUNCHER_FILE
from cpullm.core.planner import plan_service
from cpullm.core.rollout import TEMPLATE_DIGEST, template_digest

from .builders import LLAMA_LABELS as LABELS
from .builders import LLAMA_METADATA as METADATA
from .builders import LLAMA_OWNER as OWNER
from .builders import NFD, llama_8b, node, spec

TCMALLOC_X86 = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def test_deployment_whole_manifest():
    service_spec = spec(
        replicas=2,
        maxNumSeqs=8,
        hfTokenSecret={"name": "hf"},
        apiKeySecret={"name": "llama-api"},
        modelCache={"persistentVolumeClaim": {"claimName": "weights"}},
        tolerations=[{"key": "dedicated", "operator": "Exists"}],
        nodeSelector={"pool": "llm"},
        env=[{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}, {"name": "EXTRA", "value": "1"}],
        extraArgs=["--enable-prefix-caching"],
    )
    plan = plan_service(
        service_spec,
        llama_8b(),
        [node(n, numa=2, cpu="64", memory="512Gi", labels={"pool": "llm"}) for n in ("n1", "n2")],
    )
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    built = build_deployment(OWNER, service_spec, plan)
    # The digest of the template it renders: what tells a later template change (core/rollout.py).
    digest = template_digest(built["spec"]["template"])
    assert built == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**METADATA, "annotations": {TEMPLATE_DIGEST: digest}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"cpullm.io/service": "llama"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": LABELS,
                    # Annotation-based Prometheus scraping finds vLLM's /metrics on its API port; the in-pod
                    # files' digest rolls the servers onto a fix of them.
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "8000",
                        "prometheus.io/path": "/metrics",
                        "cpullm.io/in-pod-code": in_pod_code_digest(api_key_guard=True),
                    },
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "docker.io/vllm/vllm-openai-cpu:v0.32.0-x86_64",
                            # The in-pod launcher binds the ranks inside the cpuset, puts vLLM's memory check
                            # correction on PYTHONPATH, then execs vLLM.
                            "command": [
                                "python3",
                                "/opt/cpullm/launcher.py",
                                "--ranks",
                                "2",
                                "--reserved-cpus-per-rank",
                                "1",
                                "--python-path",
                                "/opt/cpullm/site",
                                "--",
                                "python3",
                                "-m",
                                "vllm.entrypoints.openai.api_server",
                            ],
                            "args": [
                                "--model",
                                "meta-llama/Llama-3.1-8B-Instruct",
                                "--dtype",
                                "bfloat16",
                                "--tensor-parallel-size",
                                "2",
                                "--distributed-executor-backend",
                                "mp",
                                "--max-model-len",
                                "16384",
                                "--max-num-seqs",
                                "8",
                                "--host",
                                "0.0.0.0",
                                "--port",
                                "8000",
                                # apiKeySecret: the key on every path, not only vLLM's /v1 (cpullm/api_key_guard.py)
                                "--middleware",
                                "cpullm_api_key_guard.ApiKeyGuard",
                                "--enable-prefix-caching",
                            ],
                            "env": [
                                {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "4"},
                                {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "auto"},
                                # A total over the ranks in vLLM 0.32: 1 per rank x 2 ranks.
                                {"name": "VLLM_CPU_NUM_OF_RESERVED_CPU", "value": "2"},
                                {"name": "LD_PRELOAD", "value": f"{TCMALLOC_X86}:/opt/venv/lib/libiomp5.so"},
                                {"name": "HF_HOME", "value": "/models/huggingface"},
                                {"name": "VLLM_CACHE_ROOT", "value": "/models/vllm"},
                                {"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/models/vllm/inductor"},
                                # A claim and the launcher's fix: vLLM's AOT compile cache (Plan.aotCompileCache).
                                {"name": "VLLM_USE_AOT_COMPILE", "value": "1"},
                                {"name": "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "value": "300"},
                                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}},
                                {
                                    "name": "VLLM_API_KEY",
                                    "valueFrom": {"secretKeyRef": {"name": "llama-api", "key": "api-key"}},
                                },
                                {"name": "PYTHONPATH", "value": "/opt/cpullm/guard"},
                                {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
                                {"name": "EXTRA", "value": "1"},
                            ],
                            "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                            "resources": {
                                "requests": {"cpu": "64", "memory": "31369Mi"},
                                "limits": {"cpu": "64", "memory": "31369Mi"},
                            },
                            "volumeMounts": [
                                {"name": "dshm", "mountPath": "/dev/shm"},
                                {"name": "model-cache", "mountPath": "/models"},
                                {"name": "launcher", "mountPath": "/opt/cpullm", "readOnly": True},
                            ],
                            # 2 x (150 s + 10 s per GiB of weights (14.96 GiB) + a 2,048-token prefill step) + 43 s
                            # per GiB for the download = 1380 s (core/timing.py), probed every 2 s
                            "startupProbe": {
                                **probe,
                                "periodSeconds": 2,
                                "timeoutSeconds": 5,
                                "failureThreshold": 690,
                            },
                            # 30 s of failed probes before the pod leaves its Service
                            "readinessProbe": {
                                **probe,
                                "periodSeconds": 2,
                                "timeoutSeconds": 5,
                                "failureThreshold": 15,
                            },
                            "livenessProbe": {
                                **probe,
                                "periodSeconds": 30,
                                "timeoutSeconds": 10,
                                "failureThreshold": 5,
                            },
                            # Drained before SIGTERM: 10 s for the endpoints to forget the pod, then until vLLM
                            # holds nothing (core/children/drain.py, tests/unit/test_drain.py).
                            "lifecycle": {
                                "preStop": {"exec": {"command": ["python3", "-c", DRAIN_SCRIPT, "8000", "10"]}}
                            },
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]},
                                "seccompProfile": {"type": "RuntimeDefault"},
                            },
                        }
                    ],
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                # n1 and n2 are labelled alike: one term of their shape's labels, no names.
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {"key": "cpullm.io/cpu-manager-policy", "operator": "DoesNotExist"},
                                            {"key": "cpullm.io/numa-nodes", "operator": "In", "values": ["2"]},
                                            {"key": "cpullm.io/topology-manager-policy", "operator": "DoesNotExist"},
                                            {"key": f"{NFD}cpu-hardware_multithreading", "operator": "DoesNotExist"},
                                            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "volumes": [
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "768Mi"}},
                        {"name": "model-cache", "persistentVolumeClaim": {"claimName": "weights"}},
                        {
                            "name": "launcher",
                            "configMap": {
                                "name": "llama-launcher",
                                "items": [
                                    {"key": "launcher.py", "path": "launcher.py"},
                                    {"key": "sitecustomize.py", "path": "site/sitecustomize.py"},
                                    {"key": "api_key_guard.py", "path": "guard/cpullm_api_key_guard.py"},
                                ],
                            },
                        },
                    ],
                    "enableServiceLinks": False,
                    # 10 s settle + drainSeconds + 30 s for vLLM to exit; 16384 tokens x a 7.5 GiB shard at
                    # 4 GB/s is over the 3600 s cap.
                    "terminationGracePeriodSeconds": 3640,
                    "nodeSelector": {"pool": "llm"},
                    "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                },
            },
        },
    }


def test_tp1_nobind_and_opt_out_of_numa_privileges():
    service_spec = spec(numaPrivileges=False, tensorParallelSize=1, service={"port": 9000})
    plan = plan_service(service_spec, llama_8b(), [node(numa=2, policy="none", cpu="32", memory="512Gi")])
    container = build_deployment(Owner("x", "ns"), service_spec, plan)["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "--distributed-executor-backend" not in container["args"]
    assert container["args"][-4:] == ["--host", "0.0.0.0", "--port", "9000"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["VLLM_CPU_OMP_THREADS_BIND"], env["OMP_NUM_THREADS"]) == ("nobind", "15")


def test_offline_render_has_no_owner_reference():
    plan = plan_service(spec(), llama_8b(), [node(memory="512Gi")])
    assert "ownerReferences" not in build_deployment(Owner("x", "ns"), spec(), plan)["metadata"]


def test_service_whole_manifest():
    service_spec = spec(service={"port": 8080, "type": "NodePort"})
    plan = plan_service(service_spec, llama_8b(), [node(memory="512Gi")])
    assert build_service(OWNER, service_spec, plan) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": METADATA,
        "spec": {
            "type": "NodePort",
            "selector": {"cpullm.io/service": "llama"},
            "ports": [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}],
        },
    }


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (7168 * 2**20, "7Gi"),
        (32816 * 2**20, "32816Mi"),
        (768 * 2**20, "768Mi"),
        (2**40, "1Ti"),
        (1000, "1000"),
        (0, "0"),
    ],
)
def test_quantities_are_rendered_in_the_api_servers_canonical_form(n, text):
    assert binary_quantity(n) == text


def shipped_fixes() -> str:
    """The fixes with cpullm/vllm_support.py inline where they import it, between its markers (no cpullm in the
    pod)."""
    before, _, rest = Path(vllm_fixes.__file__).read_text().partition("# <vllm_support>")
    after = rest.partition("# </vllm_support>\n")[2]
    return f"{before}# cpullm/vllm_support.py, inline:\n{Path(vllm_support.__file__).read_text()}\n{after}"


def test_launcher_config_map_carries_the_in_pod_files_sources():
    plan = plan_service(spec(), llama_8b(), [node(numa=2, memory="512Gi")])
    config_map = build_launcher_config_map(OWNER, spec(), plan)
    assert config_map == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**METADATA, "name": "llama-launcher"},
        "data": {
            "launcher.py": Path(launcher.__file__).read_text(),
            "sitecustomize.py": shipped_fixes(),
            "api_key_guard.py": Path(api_key_guard.__file__).read_text(),
        },
    }


@pytest.mark.parametrize(
    ("extra", "python_path", "mounted"),
    [
        ({}, None, True),
        ({"cpu": {"launcher": False}}, None, False),
        ({"apiKeySecret": {"name": "k"}}, "/opt/cpullm/guard", True),
        ({"apiKeySecret": {"name": "k"}, "cpu": {"launcher": False}}, "/opt/cpullm/guard", True),
        (
            {"apiKeySecret": {"name": "k"}, "env": [{"name": "PYTHONPATH", "value": "/mine"}]},
            "/opt/cpullm/guard:/mine",
            True,
        ),
        ({"env": [{"name": "PYTHONPATH", "value": "/mine"}]}, "/mine", True),
    ],
    ids=["no-key", "no-key-no-launcher", "key", "key-no-launcher", "key-and-users-path", "users-path"],
)
def test_the_api_key_guard_is_loaded_exactly_where_the_spec_has_a_key(extra, python_path, mounted):
    """vLLM's --middleware loads the guard from its directory on PYTHONPATH (joined with the user's: one entry of
    the name), with or without the launcher; a spec without a key renders as before the guard (no template
    change on an operator upgrade)."""
    service_spec = spec(**extra)
    plan = plan_service(service_spec, llama_8b(), [node(numa=2, memory="512Gi")])
    pod = build_deployment(OWNER, service_spec, plan)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    paths = [e.get("value") for e in container["env"] if e["name"] == "PYTHONPATH"]
    assert paths == ([python_path] if python_path else [])
    keyed = "apiKeySecret" in extra
    assert (container["args"].count("--middleware"), "cpullm_api_key_guard.ApiKeyGuard" in container["args"]) == (
        int(keyed),
        keyed,
    )
    volumes = [v for v in pod["volumes"] if v["name"] == "launcher"]
    assert bool(volumes) is mounted
    if volumes:
        items = {i["path"] for i in volumes[0]["configMap"]["items"]}
        assert ("guard/cpullm_api_key_guard.py" in items) is keyed


@pytest.mark.parametrize(
    ("cpu", "policy", "launcher_used", "bind", "binding"),
    [
        ({}, None, True, "auto", "launcher"),
        ({"launcher": False}, None, False, "auto", "auto"),
        # The launcher leaves an explicit bind as it is and still corrects vLLM's memory checks.
        ({"threadsBind": "nobind"}, None, True, "nobind", "nobind"),
        ({"threadsBind": "0-31|32-63"}, None, True, "0-31|32-63", "0-31|32-63"),
        ({}, "none", True, "nobind", "nobind"),  # no exclusive cpuset: nothing to bind to
    ],
    ids=["default", "opt-out", "nobind", "explicit-list", "cpu-manager-none"],
)
def test_the_launcher_starts_vllm_unless_opted_out_and_binds_only_auto(cpu, policy, launcher_used, bind, binding):
    service_spec = spec(cpu=cpu)
    plan = plan_service(service_spec, llama_8b(), [node(numa=2, cpu="64", memory="512Gi", policy=policy)])
    pod = build_deployment(OWNER, service_spec, plan)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert plan.launcher is launcher_used
    assert (container["command"][:2] == ["python3", "/opt/cpullm/launcher.py"]) is launcher_used
    assert container["command"][-3:] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert ("launcher" in {v["name"] for v in pod["volumes"]}) is launcher_used
    assert ("/opt/cpullm" in {m["mountPath"] for m in container["volumeMounts"]}) is launcher_used
    assert {e["name"]: e.get("value") for e in container["env"]}["VLLM_CPU_OMP_THREADS_BIND"] == bind
    assert plan.binding == binding
    assert f"{binding} binding" in plan.summary


CLAIM = {"persistentVolumeClaim": {"claimName": "weights"}}


@pytest.mark.parametrize(
    ("model_cache", "volume", "ephemeral_request"),
    [
        # Llama-3.1-8B: 2 x 16.06 GB (a float32 checkpoint served in bfloat16) + 2 GiB, in whole GiB -> 32Gi.
        (None, {"emptyDir": {"sizeLimit": "32Gi"}}, "32Gi"),
        ({"emptyDir": {"sizeLimit": "50Gi"}}, {"emptyDir": {"sizeLimit": "50Gi"}}, "50Gi"),
        (CLAIM, CLAIM, None),
    ],
    ids=["default", "emptyDir", "claim"],
)
def test_model_cache_is_bounded_and_requested_as_ephemeral_storage(model_cache, volume, ephemeral_request):
    """An emptyDir without a limit lets a pod fill the node's disk; with one, the pod requests that much ephemeral
    storage, so the scheduler puts it only where the disk can hold the model. A claim's storage is not the node's."""
    service_spec = spec(modelCache=model_cache) if model_cache else spec()
    plan = plan_service(service_spec, llama_8b(), [node(memory="512Gi")])
    pod = build_deployment(Owner("x", "ns"), service_spec, plan)["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert {"name": "model-cache", **volume} in pod["volumes"]
    assert resources["requests"].get("ephemeral-storage") == ephemeral_request
    assert "ephemeral-storage" not in resources["limits"]  # the sizeLimit bounds it; cpu and memory stay Guaranteed
    assert {k: v for k, v in resources["requests"].items() if k != "ephemeral-storage"} == resources["limits"]


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ([{"name": "PYTHONPATH", "value": "/mine"}], False),
        ([{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "paths", "key": "python"}}}], True),
        ([{"name": "PYTHONPATH"}], True),
        ([{"name": "OTHER", "valueFrom": {"configMapKeyRef": {"name": "paths", "key": "other"}}}], False),
    ],
)
def test_with_a_key_a_pythonpath_the_guard_cannot_join_is_refused_not_dropped(env, refused):
    """The guard's directory and the user's PYTHONPATH share one variable: a valueFrom has no text to join."""
    fields = {"apiKeySecret": {"name": "k"}, "env": env}
    if refused:
        with pytest.raises(ValueError, match="env PYTHONPATH must be a value"):
            spec(**fields)
    else:
        assert spec(**fields).env[0].name == env[0]["name"]
    assert spec(env=env).env  # without a key, the user's PYTHONPATH is passed as it is


def test_a_change_of_the_in_pod_files_changes_the_servers_template(monkeypatch):
    """The digest covers the files the pod mounts: the guard's only where the spec has an API key; a fix to any of
    them is a new template, which the operator rolls out (paced)."""
    before = {guard: in_pod_code_digest(guard) for guard in (False, True)}
    assert before[False] != before[True]
    fixed = {**children_launcher.SOURCES, API_KEY_GUARD_FILE: children_launcher.SOURCES[API_KEY_GUARD_FILE] + "#"}
    monkeypatch.setattr(children_launcher, "SOURCES", fixed)
    assert in_pod_code_digest(False) == before[False] and in_pod_code_digest(True) != before[True]
    fixed = {**fixed, LAUNCHER_FILE: fixed[LAUNCHER_FILE] + "#"}
    monkeypatch.setattr(children_launcher, "SOURCES", fixed)
    assert in_pod_code_digest(False) != before[False]


@pytest.mark.parametrize(
    ("key", "rendered"),
    [({"name": "k"}, None), ({"name": "k", "metrics": "open"}, None), ({"name": "k", "metrics": "key"}, "key")],
    ids=["default", "open", "key"],
)
def test_metrics_behind_the_key_is_the_guards_switch_and_nothing_else(key, rendered):
    """spec.apiKeySecret.metrics: key sets the guard's switch; open (the default) renders as before the field (no
    template change, no rollout, on an upgrade), and spec.env cannot set the switch."""
    service_spec = spec(apiKeySecret=key)
    plan = plan_service(service_spec, llama_8b(), [node(numa=2, memory="512Gi")])
    (container,) = build_deployment(OWNER, service_spec, plan)["spec"]["template"]["spec"]["containers"]
    found = [e.get("value") for e in container["env"] if e["name"] == vllm_support.GUARD_METRICS_ENV]
    assert found == ([rendered] if rendered else [])
    with pytest.raises(ValueError, match=r"apiKeySecret\.metrics"):
        spec(env=[{"name": vllm_support.GUARD_METRICS_ENV, "value": "open"}])
