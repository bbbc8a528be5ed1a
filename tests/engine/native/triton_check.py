"""The Triton kernel against the torch path, in Triton's interpreter on the CPU; runs in the
vLLM environment (it has triton), not under pytest:

    TRITON_INTERPRET=1 PYTHONPATH=. .venv-vllm/bin/python tests/engine/native/triton_check.py

On a GPU, compiled: `PYTHONPATH=. python3 tests/engine/native/triton_check.py cuda` (the
tensors live on the device named by the first argument). Prints one line per case and exits
non-zero at the first mismatch."""

from __future__ import annotations

import math
import sys

import torch

from qlm.engine.native.attention import attend, shared_prefix_attention
from qlm.engine.native.triton_attention import attend_slots, shared_prefix_decode

ATOL = 1e-4


def case(
    device: str, prefix_len: int, own_lens: list[int], heads: int, kv_heads: int, dim: int
) -> float:
    gen = torch.Generator().manual_seed(prefix_len + dim)
    slots = prefix_len + sum(own_lens) + 7
    k = torch.randn(slots, kv_heads, dim, generator=gen)
    v = torch.randn(slots, kv_heads, dim, generator=gen)
    order = torch.randperm(slots, generator=gen)  # paged: slots anywhere in the cache
    prefix = order[:prefix_len]
    owns, at = [], prefix_len
    for n in own_lens:
        owns.append(order[at : at + n])
        at += n
    q = torch.randn(len(own_lens), heads, dim, generator=gen)
    scale = 1 / math.sqrt(dim)
    on = [t.to(device) for t in (q, k, v, prefix, *owns)]
    got = shared_prefix_decode(*on[:4], on[4:], scale).cpu()
    queries = [q[i : i + 1] for i in range(len(own_lens))]
    starts = [prefix_len + n - 1 for n in own_lens]
    want = shared_prefix_attention(
        queries, starts, (k[prefix], v[prefix]), [(k[s], v[s]) for s in owns], scale
    )
    error = float((got - torch.cat(want)).abs().max())
    rows = q[0].view(kv_heads, heads // kv_heads, dim)
    alone = attend_slots(rows.to(device), *on[1:4], scale)[0].cpu()
    whole, _ = attend(q[0:1], k[prefix], v[prefix], prefix_len, scale)
    return max(error, float((alone.reshape(heads, dim) - whole[0]).abs().max()))


def main(argv: list[str]) -> int:
    device = argv[0] if argv else "cpu"
    cases = [
        (40, [1, 5, 17], 8, 2, 16),
        (16, [3], 4, 4, 32),
        (70, [20, 2, 9, 33], 8, 1, 16),
        (100, [1, 16, 33], 16, 4, 64),
        (300, [130, 1, 70], 8, 2, 16),  # parts of the prefix and of suffixes combined
    ]
    for args in cases:
        error = case(device, *args)
        print(
            f"prefix {args[0]} own {args[1]} heads {args[2]}/{args[3]} dim {args[4]}: {error:.2e}"
        )
        if not error <= ATOL:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
