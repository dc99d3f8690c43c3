"""vLLM's CPU attention kernel alone, in a fresh process: one causal prefill of 32 tokens (bf16, 32-token blocks) with
the ISA vLLM chooses for it on this CPU (`amx` where the CPU has AMX tiles). Nothing before it multiplies a matrix, so
oneDNN never asks Linux for the AMX state on the kernel's behalf. Prints the ISA and `attention ok`; an AMX kernel in a
process without the permission dies by SIGILL. Run with the vLLM environment's python (tests/vllm/test_amx.py)."""

import torch
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

from vllm import _custom_ops as ops

HEADS, KV_HEADS, HEAD_DIM, BLOCK, TOKENS = 4, 2, 64, 32, 32
isa = _get_attn_isa(torch.bfloat16, BLOCK)
print("isa", isa, flush=True)
query = torch.randn(TOKENS, HEADS, HEAD_DIM, dtype=torch.bfloat16)
key, value = (torch.randn(TOKENS, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
key_cache, value_cache = (torch.zeros(1, KV_HEADS, BLOCK, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, torch.arange(TOKENS), isa)
starts, lengths = torch.tensor([0, TOKENS], dtype=torch.int32), torch.tensor([TOKENS], dtype=torch.int32)
metadata = ops.cpu_attn_get_scheduler_metadata(
    num_reqs=1,
    num_heads=HEADS,
    num_kv_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    seq_lens=lengths,
    dtype=torch.bfloat16,
    query_start_loc=starts,
    causal=True,
    sliding_window_size=-1,
    isa=isa,
    enable_kv_split=False,
)
output = torch.empty_like(query)
ops.cpu_attention_with_kv_cache(
    query=query,
    key_cache=key_cache,
    value_cache=value_cache,
    output=output,
    query_start_loc=starts,
    seq_lens=lengths,
    scale=HEAD_DIM**-0.5,
    causal=True,
    alibi_slopes=None,
    sliding_window=-1,
    block_table=torch.zeros(1, 1, dtype=torch.int32),
    softcap=0.0,
    scheduler_metadata=metadata,
    s_aux=None,
)
# The first query attends to the first key alone: its output is that key's value, whatever the kernel.
assert torch.allclose(output[0].float(), value[0].repeat_interleave(HEADS // KV_HEADS, 0).float(), atol=0.02)
print("attention ok", flush=True)
