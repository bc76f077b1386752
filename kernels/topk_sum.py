"""``moe.topk_sum``: the weighted sum of each token's top-k routed rows.

``out[t, h] = round_once(sum_k w[t, k] * routed[t, k, h])`` over the valid routes of token
``t``, where a route is valid when ``0 <= route_ids[t, k] < num_experts``. The fp32
accumulator starts at zero and takes one fused multiply-add per valid route in ascending ``k``
(``acc = fma(w, x, acc)``); it is rounded once, to nearest even, into the output dtype. An
invalid route is skipped entirely: its weight and its row are never read, so NaN or Inf there
cannot leak. Only ``out`` is written.

Each thread owns one 16-byte vector of a row in each of ``tokens_per_cta`` consecutive tokens:
grid ``(cdiv(num_tokens, tokens_per_cta), cdiv(hidden, cta_threads * vec))``, where ``vec`` is
8 elements of bf16/fp16. A thread reads every route id of its tokens first, then every valid
row at once (predicated loads: a guarded DSL load let ptxas wait for each row before issuing
the next), so ``topk * tokens_per_cta`` rows are in flight per thread; with one route per
token, a thread's single row would leave the memory system idle behind its route-id round
trip. Each output is computed alike whatever ``tokens_per_cta``: the same bits.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from ._base import AotKernel, dsl_dtype
from ._ptx import ld_v4_if

__all__ = ["TopKSum"]


class TopKSum(AotKernel):
    def __init__(
        self,
        geometry,
        static,
        *,
        element: str,
        output: str,
        topk: int,
        hidden: int,
        cta_threads: int,
        tokens_per_cta: int = 1,
    ):
        super().__init__(
            geometry,
            static,
            element=element,
            output=output,
            topk=topk,
            hidden=hidden,
            cta_threads=cta_threads,
            tokens_per_cta=tokens_per_cta,
        )
        self.element = dsl_dtype(element)
        self.output = dsl_dtype(output)
        self.topk = topk
        self.hidden = hidden
        self.cta_threads = cta_threads
        self.tokens = tokens_per_cta
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
        group, chunk, _ = cute.arch.block_idx()
        vec, topk = self.vec, self.topk
        row_vectors = self.hidden // vec
        v = chunk * self.cta_threads + tidx

        m_out = self.vectors(out, vec, num_tokens * row_vectors)
        m_weights = self.tensor(weights, num_tokens * topk)
        m_ids = self.tensor(route_ids, num_tokens * topk)

        if v < row_vectors:
            # Every token's route ids and weights first, so their latencies overlap; then every
            # valid row (a row is read only when its route is valid), all before the first
            # store, which ptxas must assume may write them; then the sums, in ascending k.
            tokens = [group * self.tokens + t for t in range(self.tokens)]
            routes, valid, weights_tk = [], [], []  # per (token, k), token-major
            for t in cutlass.range_constexpr(self.tokens):
                token = tokens[t]
                for k in cutlass.range_constexpr(topk):
                    route = token * topk + k
                    if cutlass.const_expr(self.tokens == 1):
                        expert = m_ids[route]  # the grid holds no token past the last
                    else:
                        expert = Int32(-1)
                        if token < num_tokens:
                            expert = m_ids[route]
                    ok = (expert >= 0) & (expert < num_experts)
                    w = Float32(0.0)
                    if ok:
                        w = m_weights[route]
                    routes.append(route)
                    valid.append(ok)
                    weights_tk.append(w)
            words = cute.make_rmem_tensor((4, len(valid)), Uint32)
            for i in cutlass.range_constexpr(len(valid)):
                row = routed.toint() + Int64(routes[i] * row_vectors + v) * 16
                loaded = ld_v4_if(Int32(valid[i]), row)
                for j in cutlass.range_constexpr(4):
                    words[j, i] = loaded[j]
            x = cute.recast_tensor(words, self.element)
            for t in cutlass.range_constexpr(self.tokens):
                token = tokens[t]
                acc = cute.make_rmem_tensor((vec,), Float32)
                acc.fill(0.0)
                for k in cutlass.range_constexpr(topk):
                    i = t * topk + k
                    if valid[i]:
                        acc.store(acc.load() + weights_tk[i] * x[None, i].load().to(Float32))
                y = cute.make_rmem_tensor((vec,), self.output)
                y.store(acc.load().to(self.output))
                if cutlass.const_expr(self.tokens == 1):
                    cute.autovec_copy(y, m_out[None, token * row_vectors + v])
                else:
                    if token < num_tokens:
                        cute.autovec_copy(y, m_out[None, token * row_vectors + v])
