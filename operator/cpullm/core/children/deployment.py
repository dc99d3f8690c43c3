"""The Deployment running a CpuLLMService's vLLM pods: what to run comes from the spec (model, user env,
volumes), how much and where from the plan (ranks, KV, binding, resources, context length, nodes)."""

from __future__ import annotations

import math
from typing import Any

from cpullm.api.plan import Plan, ServerSecurity
from cpullm.api.spec import SPECULATIVE_ENV, CpuLLMServiceSpec, KVCacheDType, MetricsAccess
from cpullm.core import constants as c
from cpullm.core.adapters import lora_args
from cpullm.core.children.common import PORT_NAME, Owner, binary_quantity, labels, metadata, selector
from cpullm.core.children.drain import drain_hook, grace_seconds
from cpullm.core.children.launcher import (
    IN_POD_CODE,
    in_pod_code_digest,
    launcher_command,
    launcher_volume,
    launcher_volume_mount,
)
from cpullm.core.children.model_cache import compile_cache_volume, ephemeral_storage_request, model_cache_source
from cpullm.core.node_selection import combine_terms
from cpullm.core.rollout import TEMPLATE_DIGEST, template_digest
from cpullm.vllm_support import GUARD_METRICS_ENV, kv_cache_env

CONTAINER_NAME = "vllm"
PYTHONPATH = "PYTHONPATH"
VLLM_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]


def vllm_command(plan: Plan) -> list[str]:
    """vLLM's server, started through the in-pod launcher unless the spec opts out (spec.cpu.launcher)."""
    if not plan.launcher:
        return list(VLLM_COMMAND)
    return [*launcher_command(plan), "--", *VLLM_COMMAND]


def vllm_args(spec: CpuLLMServiceSpec, plan: Plan) -> list[str]:
    model = spec.model
    args = ["--model", model.name]
    if model.revision:
        args += ["--revision", model.revision]
    args += ["--dtype", model.dtype.value, "--tensor-parallel-size", str(plan.tensor_parallel_size)]
    if plan.tensor_parallel_size > 1:
        args += ["--distributed-executor-backend", "mp"]
    if plan.max_model_len is not None:
        args += ["--max-model-len", str(plan.max_model_len)]
    if spec.kv_cache_dtype != KVCacheDType.AUTO:
        args += ["--kv-cache-dtype", spec.kv_cache_dtype.value]
    if plan.max_num_seqs is not None:
        args += ["--max-num-seqs", str(plan.max_num_seqs)]
    if plan.speculative is not None and plan.speculative.vllm_config:
        args += ["--speculative-config", plan.speculative.vllm_config]
    args += lora_args(spec.adapters)
    args += ["--host", "0.0.0.0", "--port", str(spec.service.port)]
    if spec.api_key_secret is not None:
        args += ["--middleware", c.API_KEY_GUARD_MIDDLEWARE]
    return args + list(spec.extra_args)


def in_pod_files(spec: CpuLLMServiceSpec, plan: Plan) -> bool:
    """Does the pod mount the launcher's ConfigMap: for the launcher, or for the API key guard."""
    return plan.launcher or spec.api_key_secret is not None


def _python_path(spec: CpuLLMServiceSpec) -> list[dict[str, Any]]:
    """The API key guard's directory on PYTHONPATH, before the user's PYTHONPATH if spec.env sets one (joined into
    one variable: of two entries of a name the last wins, and the user's would drop the guard)."""
    if spec.api_key_secret is None:
        return []
    guard = f"{c.LAUNCHER_MOUNT}/{c.API_KEY_GUARD_DIR}"
    users = next((e.value for e in spec.env if e.name == PYTHONPATH), None)
    return [{"name": PYTHONPATH, "value": f"{guard}:{users}" if users else guard}]


def vllm_env(spec: CpuLLMServiceSpec, plan: Plan) -> list[dict[str, Any]]:
    """The operator's env, then the user's."""
    env: list[dict[str, Any]] = [
        {"name": kv_cache_env(plan.vllm_version), "value": str(plan.kv_cache_gi_b)},
        {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": plan.threads_bind},
        # vLLM 0.32 reads this as the total over the pod's ranks (vllm/utils/ompmultiprocessing.py).
        {"name": "VLLM_CPU_NUM_OF_RESERVED_CPU", "value": str(plan.reserved_cpus_per_rank * plan.tensor_parallel_size)},
    ]
    if plan.omp_num_threads is not None:
        env.append({"name": "OMP_NUM_THREADS", "value": str(plan.omp_num_threads)})
    preload = c.LD_PRELOAD_BY_ARCH.get(plan.node_profile.arch)
    if preload:
        env.append({"name": "LD_PRELOAD", "value": preload})
    env.append({"name": "HF_HOME", "value": c.HF_HOME})
    env += [{"name": name, "value": value} for name, value in c.COMPILE_CACHE_ENV.items()]
    env.append({"name": c.AOT_COMPILE_ENV, "value": "1" if plan.aot_compile_cache else "0"})
    env.append({"name": "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "value": str(plan.step_timeout_seconds)})
    if plan.speculative is not None and plan.speculative.vllm_config:
        env += [{"name": k, "value": v} for k, v in SPECULATIVE_ENV.get(plan.speculative.method, {}).items()]
    for name, ref in (("HF_TOKEN", spec.hf_token_secret), ("VLLM_API_KEY", spec.api_key_secret)):
        if ref is not None:
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if spec.metrics_need_key:
        env.append({"name": GUARD_METRICS_ENV, "value": MetricsAccess.KEY.value})
    env += _python_path(spec)
    if plan.security.run_as_user is not None:  # a non-root user: the image's HOME is root's
        env.append({"name": "HOME", "value": c.SERVER_NON_ROOT_HOME})
    # spec.env cannot name what the operator sets (api/spec.py OWNED_ENV): the user's entries come after.
    joined = {PYTHONPATH} if spec.api_key_secret is not None else set()
    return env + [e.model_dump(by_alias=True, exclude_none=True) for e in spec.env if e.name not in joined]


def security_context(security: ServerSecurity) -> dict[str, Any]:
    """Least privilege as the namespace admits it (core/podsecurity.py): every capability dropped but SYS_NICE
    where it is the way to vLLM's NUMA calls, no privilege escalation, the seccomp profile chosen, and a non-root
    user where Pod Security restricted requires one."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if security.capabilities:
        capabilities["add"] = list(security.capabilities)
    seccomp = {"type": security.seccomp_profile}
    if security.localhost_profile:
        seccomp["localhostProfile"] = security.localhost_profile
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": capabilities,
        "seccompProfile": seccomp,
    }
    if security.run_as_user is not None:
        context |= {"runAsNonRoot": True, "runAsUser": security.run_as_user, "runAsGroup": security.run_as_user}
    return context


def _probes(plan: Plan) -> dict[str, Any]:
    def http(**extra: int) -> dict[str, Any]:
        return {"httpGet": {"path": "/health", "port": PORT_NAME}, **extra}

    return {
        "startupProbe": http(
            periodSeconds=c.PROBE_PERIOD_SECONDS,
            timeoutSeconds=5,
            failureThreshold=math.ceil(plan.startup_seconds / c.PROBE_PERIOD_SECONDS),
        ),
        "readinessProbe": http(
            periodSeconds=c.PROBE_PERIOD_SECONDS,
            timeoutSeconds=5,
            failureThreshold=math.ceil(c.READINESS_TOLERANCE_SECONDS / c.PROBE_PERIOD_SECONDS),
        ),
        # A CPU server under full load answers slowly: be patient before restarting it.
        "livenessProbe": http(periodSeconds=30, timeoutSeconds=10, failureThreshold=5),
    }


def _affinity(spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any]:
    """The user's affinity, its required node affinity joined with the labels of the plan's node shape
    (core/node_selection.py): never node names, so nodes of the shape coming and going leave it as it is."""
    affinity = spec.affinity.as_pod_affinity() if spec.affinity else {}
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    users = (
        [t.model_dump(by_alias=True, exclude_defaults=True) for t in spec.affinity.required_node_terms]
        if spec.affinity
        else []
    )
    terms = combine_terms(users, plan.node_selector_terms)
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    affinity["nodeAffinity"] = node_affinity
    return affinity


def _scrape(spec: CpuLLMServiceSpec) -> dict[str, str]:
    """What annotation-based Prometheus scraping reads: vLLM serves its metrics at /metrics on its API port."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(spec.service.port),
        "prometheus.io/path": "/metrics",
    }


def _volumes(owner: Owner, spec: CpuLLMServiceSpec, cache: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": binary_quantity(plan.shm_bytes)}},
        {"name": "model-cache", **cache},
    ]
    compiled = compile_cache_volume(plan)
    if compiled is not None:
        volumes.append(compiled)
    if in_pod_files(spec, plan):
        volumes.append(launcher_volume(owner, api_key_guard=spec.api_key_secret is not None))
    return volumes


def _compile_cache_mount(plan: Plan) -> list[dict[str, Any]]:
    """The service's own directory for what a start compiles, over VLLM_CACHE_ROOT (the runtime mounts it after
    /models, its parent): where there is one (children/model_cache.py)."""
    compiled = compile_cache_volume(plan)
    return [{"name": compiled["name"], "mountPath": c.VLLM_CACHE_ROOT}] if compiled else []


def build_deployment(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any]:
    resources = {"cpu": str(plan.cpu), "memory": binary_quantity(plan.memory_limit_bytes)}
    cache = model_cache_source(spec, plan)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": plan.image,
        "command": vllm_command(plan),
        "args": vllm_args(spec, plan),
        "env": vllm_env(spec, plan),
        "ports": [{"name": PORT_NAME, "containerPort": spec.service.port, "protocol": "TCP"}],
        # Guaranteed QoS (cpu and memory requests == limits, whole CPUs): the static CPU manager gives exclusive
        # cores.
        "resources": {"requests": {**resources, **ephemeral_storage_request(cache)}, "limits": dict(resources)},
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "model-cache", "mountPath": c.MODEL_CACHE_MOUNT},
            *_compile_cache_mount(plan),
            *([launcher_volume_mount()] if in_pod_files(spec, plan) else []),
        ],
        **_probes(plan),
        "lifecycle": drain_hook(spec),
    }
    pod_spec: dict[str, Any] = {
        # The server calls no Kubernetes API: no token of the namespace's service account in its filesystem.
        "automountServiceAccountToken": False,
        "containers": [{**container, "securityContext": security_context(plan.security)}],
        "affinity": _affinity(spec, plan),
        "volumes": _volumes(owner, spec, cache, plan),
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace_seconds(plan),
    }
    if plan.security.run_as_user is not None:
        # Its group owns the volumes it writes; the model cache's files are changed only where its root's group
        # differs, not walked at every start.
        pod_spec["securityContext"] = {"fsGroup": plan.security.run_as_user, "fsGroupChangePolicy": "OnRootMismatch"}
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    annotations = _scrape(spec)
    if in_pod_files(spec, plan):
        annotations[IN_POD_CODE] = in_pod_code_digest(spec.api_key_secret is not None)
    template = {"metadata": {"labels": labels(owner), "annotations": annotations}, "spec": pod_spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**metadata(owner), "annotations": {TEMPLATE_DIGEST: template_digest(template)}},
        "spec": {
            "replicas": plan.replicas,
            "selector": {"matchLabels": selector(owner)},
            # A pod takes most of a node: a surge pod would sit Pending, so replace one at a time.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": template,
        },
    }
