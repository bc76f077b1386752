"""Operands and references the example GEMMs' GPU tests share: C = A @ B^T, A and C column
slices of wider buffers (row strides k + 8 and n + 8), B contiguous, on small integers (every
fp32 sum is exact, so one rounding into C's type must give torch's bits)."""

from __future__ import annotations

from typing import Any

from ..kernels.reference import TORCH_DTYPES


def gemm_operands(m: int, n: int, k: int, p: dict, gen: Any) -> list[Any]:
    import torch

    ab, out = TORCH_DTYPES[p["ab"]], TORCH_DTYPES[p["out"]]
    a = torch.randint(-3, 4, (m, k + 8), device="cuda", generator=gen).to(ab)[:, :k]
    b = torch.randint(-3, 4, (n, k), device="cuda", generator=gen).to(ab)
    c = torch.full((m, n + 8), float("nan"), device="cuda", dtype=out)[:, :n]
    return [a, b, c]


def gemm_reference(a: Any, b: Any, dtype: Any) -> Any:
    return (a.double() @ b.double().t()).to(dtype)


def compact_k_major(t: Any) -> Any:
    """How the DSL's GEMM examples mark a ``from_dlpack`` operand: compact, k-major, each row a
    multiple of 16 bytes."""
    return t.mark_compact_shape_dynamic(mode=1, stride_order=(0, 1), divisibility=8)


def randn_operands(m: int, n: int, k: int, p: dict, gen: Any) -> tuple[Any, Any, Any, Any]:
    """Compact operands of any values, and C with its twin for a JIT call (two poisons: an
    unwritten element cannot compare equal)."""
    import torch

    a = torch.randn(m, k, device="cuda", generator=gen).to(TORCH_DTYPES[p["ab"]])
    b = torch.randn(n, k, device="cuda", generator=gen).to(TORCH_DTYPES[p["ab"]])
    c = torch.full((m, n), float("nan"), device="cuda", dtype=TORCH_DTYPES[p["out"]])
    return a, b, c, torch.full_like(c, float("-inf"))
