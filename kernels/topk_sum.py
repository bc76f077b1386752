"""``moe.topk_sum``: the weighted sum of each token's top-k routed rows.

``out[t, h] = round_once(sum_k w[t, k] * routed[t, k, h])`` over the valid routes of token
``t``, where a route is valid when ``0 <= route_ids[t, k] < num_experts``. The fp32
accumulator starts at zero and takes one fused multiply-add per valid route in ascending ``k``
(``acc = fma(w, x, acc)``); it is rounded once, to nearest even, into the output dtype. An
invalid route is skipped entirely: its weight and its row are never read, so NaN or Inf there
cannot leak. Only ``out`` is written.

Each thread owns one 16-byte vector of a row: grid ``(num_tokens, cdiv(hidden, cta_threads *
vec))``, where ``vec`` is 8 elements of bf16/fp16.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ._base import AotKernel, dsl_dtype

__all__ = ["TopKSum"]


class TopKSum(AotKernel):
    def __init__(
        self, geometry, static, *, element: str, output: str, topk: int, hidden: int, cta_threads: int
    ):
        super().__init__(
            geometry,
            static,
            element=element,
            output=output,
            topk=topk,
            hidden=hidden,
            cta_threads=cta_threads,
        )
        self.element = dsl_dtype(element)
        self.output = dsl_dtype(output)
        self.topk = topk
        self.hidden = hidden
        self.cta_threads = cta_threads
        self.vec = 16 // (self.element.width // 8)
        if hidden % self.vec:
            raise ValueError(f"hidden must be a multiple of {self.vec} (got {hidden})")

    @cute.jit
    def __call__(
        self,
        out: cute.Pointer,
        routed: cute.Pointer,
        weights: cute.Pointer,
        route_ids: cute.Pointer,
        num_tokens: Int32,
        num_experts: Int32,
        stream: cuda.CUstream,
    ):
        self.kernel(out, routed, weights, route_ids, num_tokens, num_experts).launch(
            **self.launch_config(num_tokens=num_tokens, num_experts=num_experts), stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        out: cute.Pointer,
        routed: cute.Pointer,
        weights: cute.Pointer,
        route_ids: cute.Pointer,
        num_tokens: Int32,
        num_experts: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        token, chunk, _ = cute.arch.block_idx()
        vec = self.vec
        row_vectors = self.hidden // vec
        v = chunk * self.cta_threads + tidx

        m_routed = self.vectors(routed, vec, num_tokens * (self.topk * row_vectors))
        m_out = self.vectors(out, vec, num_tokens * row_vectors)
        m_weights = self.tensor(weights, num_tokens * self.topk)
        m_ids = self.tensor(route_ids, num_tokens * self.topk)

        if v < row_vectors:
            # Route ids and weights for every k first, so their latencies overlap; then the rows,
            # folded in ascending k (a row is read only when its route is valid).
            valid = []
            weights_k = []
            for k in cutlass.range_constexpr(self.topk):
                route = token * self.topk + k
                expert = m_ids[route]
                ok = (expert >= 0) & (expert < num_experts)
                w = Float32(0.0)
                if ok:
                    w = m_weights[route]
                valid.append(ok)
                weights_k.append(w)
            acc = cute.make_rmem_tensor((vec,), Float32)
            acc.fill(0.0)
            x = cute.make_rmem_tensor((vec,), self.element)
            for k in cutlass.range_constexpr(self.topk):
                if valid[k]:
                    cute.autovec_copy(m_routed[None, (token * self.topk + k) * row_vectors + v], x)
                    acc.store(acc.load() + weights_k[k] * x.load().to(Float32))
            y = cute.make_rmem_tensor((vec,), self.output)
            y.store(acc.load().to(self.output))
            cute.autovec_copy(y, m_out[None, token * row_vectors + v])
