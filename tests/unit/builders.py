"""Test data builders: Node objects and specs with only the fields a test cares about."""

from __future__ import annotations

from typing import Any

from testbed.objects import topology_object as topology_object  # the e2e suite makes them too

from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core.children.common import Owner
from cpullm.core.planner import plan_service
from cpullm.core.sizing import ModelSize, size_model
from cpullm.core.topology import NodeProfile, parse_node

NFD = "feature.node.kubernetes.io/"
AMX_FLAGS = ("AVX2", "AVX512F", "AVX512BW", "AVX512VL", "AVX512BF16", "AMXTILE", "AMXBF16", "AMXINT8")
AVX512_FLAGS = ("AVX2", "AVX512F", "AVX512BW", "AVX512VL", "AVX512BF16")

# The layers Llama 3 8B and Mistral 7B v0.3 share.
LAYERS_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
LLAMA_8B = {
    "model_type": "llama",
    **LAYERS_8B,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
# A W8A8 int8 checkpoint's quantization_config (compressed-tensors: per-channel weights, per-token activations).
W8A8 = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "int", "dynamic": True, "strategy": "token"},
        }
    },
    "ignore": ["lm_head"],
}
QWEN25_05B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}
QWEN3_06B = {
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
}
MISTRAL_7B_V03 = {
    "model_type": "mistral",
    **LAYERS_8B,
    "vocab_size": 32768,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
}


def node_object(
    name: str = "node-0",
    *,
    arch: str = "amd64",
    cpu: str = "64",
    memory: str = "256Gi",
    numa: int | None = 1,
    flags: tuple[str, ...] = AMX_FLAGS,
    smt: bool | None = None,
    policy: str | None = None,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/arch": arch, "kubernetes.io/hostname": name}
    if numa is not None:
        all_labels["cpullm.io/numa-nodes"] = str(numa)
    all_labels.update({f"{NFD}cpu-cpuid.{f}": "true" for f in flags})
    if smt is not None:
        all_labels[f"{NFD}cpu-hardware_multithreading"] = str(smt).lower()
    if policy is not None:
        all_labels["cpullm.io/cpu-manager-policy"] = policy
    all_labels.update(labels or {})
    spec: dict[str, Any] = {"taints": taints} if taints else {}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": spec,
        "status": {"allocatable": {"cpu": cpu, "memory": memory}},
    }


def node(name: str = "node-0", **kwargs: Any) -> NodeProfile:
    return parse_node(node_object(name, **kwargs))


def spec(**fields: Any) -> CpuLLMServiceSpec:
    """A spec for Llama-3.1-8B with a 4 GiB KV cache and a 16k context unless the test says otherwise."""
    raw: dict[str, Any] = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "kvCacheGiB": 4, "maxModelLen": 16384}
    raw.update(fields)
    return CpuLLMServiceSpec.model_validate(raw)


def llama_8b() -> ModelSize:
    return size_model(LLAMA_8B, spec().model.dtype)


def qwen_05b() -> ModelSize:
    return size_model(QWEN25_05B, spec().model.dtype)


def planned_service(name: str = "svc", namespace: str = "ns", **fields: Any) -> dict[str, Any]:
    """A CpuLLMService as stored once planned (on one default node): its spec and status.plan."""
    parsed = spec(**fields)
    plan = plan_service(parsed, llama_8b(), [node("n1")])
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": parsed.model_dump(by_alias=True, mode="json", exclude_none=True),
        "status": {"plan": plan.model_dump(by_alias=True, mode="json", exclude_none=True)},
    }


GB = 1e9


def probe_object(name: str = "n1", numa: int = 1, cpus: int = 32, scale: float = 1.0) -> dict[str, Any]:
    """A NodePerformance as `cpullm probe` prints it: `numa` NUMA nodes of `cpus` CPUs; `scale` multiplies every
    rate (a faster or slower machine)."""

    def threads(count: int) -> dict[str, Any]:
        per = min(count, 8) * scale  # memory saturates at 8 threads' worth
        return {
            "threads": count,
            "readBytesPerSecond": 10 * GB * per,
            "smallKernelSeconds": 3e-5,
            "bf16WeightBytesPerSecond": {
                "1": 9 * GB * per,
                "8": 9 * GB * per,
                "32": 6 * GB * per,
                "1024": 0.5 * GB * count * scale,
            },
            "int8WeightBytesPerSecond": {
                "1": 8 * GB * per,
                "8": 8 * GB * per,
                "32": 5 * GB * per,
                "1024": 0.4 * GB * count * scale,
            },
        }

    return {
        "apiVersion": "cpullm.io/v1alpha1",
        "kind": "NodePerformance",
        "metadata": {"name": name},
        "spec": {
            "cpu": {"model": "Test CPU", "arch": "x86_64", "flags": ["avx512f"]},
            "pythonSeconds": 0.007,
            "measuredAt": "2026-11-28T00:00:00Z",
            "numaNodes": [
                {"node": n, "cpus": cpus, "oneThread": threads(1), "allCores": threads(cpus)} for n in range(numa)
            ],
        },
    }


# The service "llama" in namespace "serving" whose children the manifest tests build: its owner, its children's
# labels and the metadata each child carries.
LLAMA_OWNER = Owner(name="llama", namespace="serving", uid="uid-1")
LLAMA_LABELS = {
    "app.kubernetes.io/name": "vllm",
    "app.kubernetes.io/instance": "llama",
    "app.kubernetes.io/managed-by": "cpullm-operator",
    "cpullm.io/service": "llama",
}
LLAMA_OWNER_REFERENCE = {
    "apiVersion": "cpullm.io/v1alpha1",
    "kind": "CpuLLMService",
    "name": "llama",
    "uid": "uid-1",
    "controller": True,
    "blockOwnerDeletion": True,
}
LLAMA_METADATA = {
    "name": "llama",
    "namespace": "serving",
    "labels": LLAMA_LABELS,
    "ownerReferences": [LLAMA_OWNER_REFERENCE],
}
