"""moe.w4a16 GPU cases: inputs, scratch and output of one launch pair, shared by the GPU tests
(against the torch references) and the AOT-vs-JIT test."""

from __future__ import annotations

import copy

import pytest
import torch

from b12x_aot.ops import w4a16_weights

from ..conftest import family_variants
from .reference import TORCH_DTYPES
from .w4a16_reference import moe_w4a16, random_weights

MAX_ROWS = 4096  # the largest m any case launches: scratch is sized for it


def experts_for(p: dict) -> int:
    """Resident experts of a case: 16, or ``e_cap`` when smaller."""
    return min(16, p["e_cap"])


def route_pack_for(registry, arch: str, p: dict):
    """A prepared moe.route_pack variant whose scratch layout matches the GEMM's params."""
    for e in family_variants(registry, "moe.route_pack", arch):
        q = e.params
        if (q["topk"], q["block_m"], q["e_cap"]) == (p["topk"], p["block_m"], p["e_cap"]):
            return prepared(registry, e)
    pytest.fail(
        f"the registry has moe.w4a16 variants but no moe.route_pack variant for topk={p['topk']} "
        f"block_m={p['block_m']} e_cap={p['e_cap']}: build or export the route packs with the GEMMs"
    )


def route_ids(m: int, topk: int, experts: int, gen, invalid_fraction: float = 0.2) -> torch.Tensor:
    """Uniform routes, with ``invalid_fraction`` of them -1, ``experts`` or 2**30."""
    ids = torch.randint(0, experts, (m, topk), device="cuda", generator=gen, dtype=torch.int32)
    bad = torch.tensor((-1, experts, 2**30), device="cuda", dtype=torch.int32)
    pick = torch.randint(0, 3, (m, topk), device="cuda", generator=gen)
    invalid = torch.rand(m, topk, device="cuda", generator=gen) < invalid_fraction
    return torch.where(invalid, bad[pick], ids)


class Case:
    """Inputs, scratch and output of one (variant, m) launch pair; the output starts as NaN."""

    def __init__(self, p: dict, m: int, gen, pack, *, weights=None, invalid_fraction: float = 0.2):
        self.p, self.m = p, m
        self.experts = experts_for(p)
        element = TORCH_DTYPES[p["element"]]
        self.a = torch.randn(m, p["k"], device="cuda", generator=gen).to(element)
        self.ids = route_ids(m, p["topk"], self.experts, gen, invalid_fraction)
        # rows: the [E, n, k / 2] weights the references read; w: the same bytes in the
        # variant's w_layout, what the kernel reads (the same tensor for nk)
        self.rows, self.s = weights or random_weights(
            self.experts, p["n"], p["k"], p["group"], element, device="cuda", generator=gen
        )
        self.w = w4a16_weights(self.rows, p.get("w_layout", "nk"))
        words = pack.shapes(num_tokens=MAX_ROWS, num_experts=self.experts)["scratch"]
        self.scratch = torch.full(words, -(2**31), device="cuda", dtype=torch.int32)
        self.out = torch.full(
            (m, p["topk"], p["n"]), float("nan"), device="cuda", dtype=TORCH_DTYPES[p["output"]]
        )

    def twin(self) -> Case:
        """The same inputs (weights shared), with its own scratch and a -inf output: another
        poison than this case's NaN, so an element that neither launch writes cannot compare
        equal. (The scratch keeps the same poison: a launch writes only its num_tokens' part.)"""
        other = copy.copy(self)
        other.a, other.ids = self.a.clone(), self.ids.clone()
        other.scratch = torch.full_like(self.scratch, -(2**31))
        other.out = torch.full_like(self.out, float("-inf"))
        return other

    def inputs(self) -> dict:
        return {"a": self.a, "route_ids": self.ids, "w": self.w, "scales": self.s}

    def launch(self, pack, gemm, *, checked: bool = True) -> None:
        call_pack, call_gemm = (pack.checked, gemm.checked) if checked else (pack, gemm)
        call_pack(self.scratch, self.ids, self.m, self.experts)
        call_gemm(self.out, self.a, self.w, self.s, self.scratch, self.m, self.experts)

    def reference(self, *, rounded: bool) -> torch.Tensor:
        p = self.p
        return moe_w4a16(
            self.a.double(),
            self.ids,
            self.rows,
            self.s,
            group=p["group"],
            num_experts=self.experts,
            e_cap=p["e_cap"],
            acc_dtype=torch.float64,
            rounded=rounded,
        )

    def invalid(self) -> torch.Tensor:
        return (self.ids < 0) | (self.ids >= self.experts)


def prepared(registry, entry):
    """The registry kernel of ``entry``, resolved and preloaded."""
    return registry.kernel(entry.family, entry.abi, **entry.params).prepare()
