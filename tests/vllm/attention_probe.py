"""vLLM's CPU attention kernel alone, in a fresh process: one causal prefill of 32 tokens (bf16, 32-token blocks) with
the ISA vLLM chooses for it on this CPU (`amx` where the CPU has AMX tiles). Nothing before it multiplies a matrix, so
oneDNN never asks Linux for the AMX state on the kernel's behalf. Prints the ISA and `attention ok`; an AMX kernel in a
process without the permission dies by SIGILL. Run with the vLLM environment's python (tests/vllm/test_amx.py)."""

import importlib.util
from pathlib import Path

import torch
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

from vllm import _custom_ops as ops

# The probe's own call of the kernel (operator/cpullm/perf_probe.py: the standard library and torch, as a Job runs it).
_FILE = Path(__file__).resolve().parents[2] / "operator" / "cpullm" / "perf_probe.py"
_SPEC = importlib.util.spec_from_file_location("perf_probe", _FILE)
assert _SPEC is not None and _SPEC.loader is not None
perf_probe = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(perf_probe)

HEADS, KV_HEADS, HEAD_DIM, BLOCK, TOKENS = 4, 2, 64, 32, 32
isa = _get_attn_isa(torch.bfloat16, BLOCK)
print("isa", isa, flush=True)
query = torch.randn(TOKENS, HEADS, HEAD_DIM, dtype=torch.bfloat16)
key, value = (torch.randn(TOKENS, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
key_cache, value_cache = (torch.zeros(1, KV_HEADS, BLOCK, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, torch.arange(TOKENS), isa)
starts, table = torch.tensor([0, TOKENS], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32)
run, output = perf_probe.attention_call(ops, isa, query, (key_cache, value_cache), table, starts, [TOKENS])
run()
# The first query attends to the first key alone: its output is that key's value, whatever the kernel.
assert torch.allclose(output[0].float(), value[0].repeat_interleave(HEADS // KV_HEADS, 0).float(), atol=0.02)
print("attention ok", flush=True)
