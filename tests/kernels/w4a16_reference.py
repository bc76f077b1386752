"""Pure-torch references for ``moe.route_pack`` and ``moe.w4a16`` (CPU or CUDA tensors).

Formats (the kernels' contract):

- Packed int4 weights ``w[e, n, k // 2]`` (uint8): element ``k`` of row ``n`` is the low
  nibble of byte ``k // 2`` when ``k`` is even, the high nibble when odd; a nibble is a
  two's-complement value in ``[-8, 7]``.
- Group scales ``s[e, n, k // group]`` in the activation dtype; ``dequant(w)[n, k] =
  int4 * s[n, k // group]``. The kernel either feeds the tensor cores that product rounded once
  to the activation dtype (``rounded=True`` here), or, on its decode tiles, the exact int4 and
  applies ``s`` to fp32 partial sums (``rounded=False``: the product is used exactly).
- Route packing writes the spec's ``scratch`` shape of i32 words; see :func:`route_pack`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "HEADER_WORDS",
    "PackedRoutes",
    "dequantize",
    "max_blocks",
    "moe_w4a16",
    "pack_int4",
    "random_weights",
    "route_pack",
    "scratch_image",
    "unpack_int4",
    "unpack_scratch",
]

HEADER_WORDS = 4


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """``int`` tensor ``[..., k]`` with values in ``[-8, 7]`` -> uint8 ``[..., k // 2]``, low nibble first."""
    if q.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even (got {q.shape[-1]})")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError(f"int4 values must be in [-8, 7] (got {int(q.min())}..{int(q.max())})")
    nib = (q.to(torch.int16) & 0xF).to(torch.uint8)
    return nib[..., 0::2] | (nib[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., k // 2]`` -> int8 ``[..., k]`` in ``[-8, 7]`` (inverse of :func:`pack_int4`)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed weights must be uint8 (got {packed.dtype})")
    lo = (packed & 0xF).to(torch.int8)
    hi = (packed >> 4).to(torch.int8)
    both = torch.stack((lo, hi), dim=-1).flatten(-2)
    return torch.where(both >= 8, both - 16, both)


def dequantize(
    packed: torch.Tensor, scales: torch.Tensor, group: int, *, rounded: bool = True
) -> torch.Tensor:
    """``int4 * scale``, shape ``[..., n, k]``: rounded once to the scales' dtype, or exact (fp64)."""
    q = unpack_int4(packed).double()
    if q.shape[-1] != scales.shape[-1] * group:
        raise ValueError(f"k = {q.shape[-1]} does not match {scales.shape[-1]} groups of {group}")
    exact = q * scales.double().repeat_interleave(group, dim=-1)
    return exact.to(scales.dtype) if rounded else exact


def random_weights(
    experts: int, n: int, k: int, group: int, dtype: torch.dtype, *, device="cpu", generator=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed int4 weights and positive scales of about ``1 / sqrt(k)`` magnitude."""
    q = torch.randint(-8, 8, (experts, n, k), device=device, generator=generator, dtype=torch.int8)
    scales = torch.rand(experts, n, k // group, device=device, generator=generator) * 0.5 + 0.25
    return pack_int4(q), (scales / (4 * k**0.5)).to(dtype)


def max_blocks(num_tokens: int, topk: int, block_m: int, e_cap: int) -> int:
    """``B``: blocks route packing may use, ``cdiv(R, block_m) + min(R, e_cap + 1)``."""
    routes = max(num_tokens, 0) * topk
    return -(-routes // block_m) + min(routes, e_cap + 1)


@dataclass(frozen=True)
class PackedRoutes:
    """What route packing produces: per-block expert (-1 = zero block) and row routes (-1 = pad)."""

    block_expert: torch.Tensor  # i32 [blocks]
    rows: torch.Tensor  # i32 [blocks, block_m]
    valid: int
    invalid: int


def route_pack(route_ids: torch.Tensor, num_experts: int, *, block_m: int, e_cap: int) -> PackedRoutes:
    """Stable counting sort of routes into expert buckets, then the zero bucket, in blocks."""
    ids = route_ids.reshape(-1).to(torch.int64).cpu()
    live = min(max(num_experts, 0), e_cap)
    bucket = torch.where((ids >= 0) & (ids < live), ids, torch.full_like(ids, e_cap))
    experts, rows = [], []
    for b in range(e_cap + 1):
        members = torch.nonzero(bucket == b).flatten().to(torch.int32)  # ascending route order
        for start in range(0, members.numel(), block_m):
            chunk = members[start : start + block_m]
            row = torch.full((block_m,), -1, dtype=torch.int32)
            row[: chunk.numel()] = chunk
            experts.append(b if b < e_cap else -1)
            rows.append(row)
    block_expert = torch.tensor(experts, dtype=torch.int32)
    stacked = torch.stack(rows) if rows else torch.empty(0, block_m, dtype=torch.int32)
    invalid = int((bucket == e_cap).sum())
    return PackedRoutes(block_expert, stacked, ids.numel() - invalid, invalid)


def unpack_scratch(
    scratch: torch.Tensor, num_tokens: int, *, topk: int, block_m: int, e_cap: int
) -> tuple[torch.Tensor, PackedRoutes]:
    """Read a route-pack scratch buffer back: (header[4], the blocks it holds)."""
    s = scratch.reshape(-1).to(torch.int32).cpu()
    bound = max_blocks(num_tokens, topk, block_m, e_cap)
    header = s[:HEADER_WORDS].clone()
    used = int(header[0])
    if not 0 <= used <= bound:
        raise ValueError(f"scratch says {used} blocks; the bound for {num_tokens} tokens is {bound}")
    block_expert = s[HEADER_WORDS : HEADER_WORDS + used].clone()
    base = HEADER_WORDS + bound
    rows = s[base : base + used * block_m].reshape(used, block_m).clone()
    return header, PackedRoutes(block_expert, rows, int(header[1]), int(header[2]))


def scratch_image(
    packed: PackedRoutes, num_tokens: int, words: int, *, topk: int, block_m: int, e_cap: int, fill: int
) -> torch.Tensor:
    """The whole ``words``-word scratch as a route pack of ``packed`` leaves it when every word
    held ``fill`` before: header, block map and used blocks' rows written, the rest ``fill``."""
    s = torch.full((words,), fill, dtype=torch.int32)
    used = packed.block_expert.numel()
    s[:HEADER_WORDS] = torch.tensor([used, packed.valid, packed.invalid, 0], dtype=torch.int32)
    s[HEADER_WORDS : HEADER_WORDS + used] = packed.block_expert
    base = HEADER_WORDS + max_blocks(num_tokens, topk, block_m, e_cap)
    s[base : base + used * block_m] = packed.rows.reshape(-1)
    return s


def moe_w4a16(
    a: torch.Tensor,
    route_ids: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    *,
    group: int,
    num_experts: int,
    e_cap: int,
    acc_dtype: torch.dtype = torch.float32,
    rounded: bool = True,
) -> torch.Tensor:
    """``out[t, j] = a[t] @ dequantize(w[route_ids[t, j]], rounded).T`` in ``acc_dtype``; invalid rows are 0.

    Computed per expert over its routed rows (fp32 or fp64 accumulation); the caller rounds to
    the output dtype. Weights of experts that no valid route names are never dequantized.
    """
    m, topk = route_ids.shape
    n = packed.shape[1]
    live = min(max(num_experts, 0), e_cap)
    out = torch.zeros(m * topk, n, dtype=acc_dtype, device=a.device)
    flat = route_ids.reshape(-1).to(torch.int64)
    tokens = torch.arange(m * topk, device=a.device) // topk
    for e in torch.unique(flat[(flat >= 0) & (flat < live)]).tolist():
        sel = torch.nonzero(flat == e).flatten()
        w = dequantize(packed[e], scales[e], group, rounded=rounded).to(acc_dtype)
        out[sel] = a[tokens[sel]].to(acc_dtype) @ w.T
    return out.reshape(m, topk, n)
