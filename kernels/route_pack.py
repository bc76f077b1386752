"""``moe.route_pack``: bucket routes by expert into blocks of ``block_m`` rows, in a fixed scratch.

Inputs: ``route_ids[num_tokens, topk]`` (i32) and ``num_experts``. A route ``r = t * topk + j``
is valid when ``0 <= route_ids[r] < min(num_experts, e_cap)``; every other route (negative,
too large, or at/after the capacity bucket ``e_cap``) goes to the *zero bucket*.

Output, into the caller-owned i32 ``scratch`` (the only memory written), with
``R = max(num_tokens, 0) * topk`` and ``B = cdiv(R, block_m) + min(R, e_cap + 1)``:

- ``scratch[0]``: number of blocks used, ``<= B``; ``scratch[1]``: valid routes;
  ``scratch[2]``: invalid routes; ``scratch[3]``: 0.
- ``scratch[4 + b]`` for ``b`` < blocks used: the expert of block ``b``, or -1 for a block of
  the zero bucket.
- ``scratch[4 + B + b * block_m + i]``: the route of row ``i`` of block ``b`` (``token =
  route // topk``), or -1 for a padding row.

Buckets are laid out in expert order with the zero bucket last; each bucket takes
``cdiv(count, block_m)`` whole blocks, so only its last block has padding rows. Within a bucket
routes keep ascending route order (a stable counting sort), so the output is a pure function
of the inputs: deterministic, and bit-identical between eager launches and graph replays.
The required scratch is the spec's ``scratch`` shape for ``max_tokens`` (``kernel.shapes()``),
``4 + B * (1 + block_m)`` i32 words; entries past the used blocks are left untouched.

One CTA does it all, in two passes over ``route_ids`` around a scan: each warp owns a
contiguous segment of routes and counts them per bucket into its own shared histogram row
(``match.any`` groups the equal buckets of 32 routes, so no atomics are needed and order is
kept); a scan over warps and buckets turns counts into each (warp, bucket) cursor; each warp then
rescans its segment and scatters route indices. That is ``O(R / warps + e_cap)`` steps per thread, about ten
microseconds at ``R = 4096 * 8`` and one launch latency at decode sizes.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from b12x_aot.loader import cdiv

from ._base import AotKernel

__all__ = ["HEADER_WORDS", "RoutePack", "scratch_bounds"]

HEADER_WORDS = 4


def scratch_bounds(num_tokens: Int32, num_experts: Int32, *, topk: int, block_m: int, e_cap: int):
    """The scratch bounds, traced, for the kernels that write and read the scratch: the routes
    ``R``, the resident experts ``min(num_experts, e_cap)`` (both clamped at 0) and ``B``."""
    routes = cutlass.max(num_tokens, Int32(0)) * topk
    live = cutlass.min(cutlass.max(num_experts, Int32(0)), Int32(e_cap))
    bound = cdiv(routes, block_m) + cutlass.min(routes, Int32(e_cap + 1))
    return routes, live, bound


class RoutePack(AotKernel):
    def __init__(self, geometry, static, *, topk: int, block_m: int, e_cap: int, cta_threads: int):
        super().__init__(geometry, static, topk=topk, block_m=block_m, e_cap=e_cap, cta_threads=cta_threads)
        self.topk = topk
        self.block_m = block_m
        self.e_cap = e_cap
        self.cta_threads = cta_threads
        self.warps = cta_threads // 32
        self.buckets = e_cap + 1  # experts, then the zero bucket
        self.per_lane = cdiv(self.buckets, 32)
        self.row_words = cdiv(self.buckets, 4) * 4  # rows padded to 16 bytes
        need = 4 * (self.warps + 2) * self.row_words
        if cta_threads % 32 or self.static.smem < need:
            raise ValueError(
                f"route_pack needs a multiple of 32 threads and {need} B of shared memory "
                f"(got {cta_threads} threads, {self.static.smem} B)"
            )

    @cute.jit
    def __call__(
        self,
        scratch: cute.Pointer,
        route_ids: cute.Pointer,
        num_tokens: Int32,
        num_experts: Int32,
        stream: cuda.CUstream,
    ):
        self.kernel(scratch, route_ids, num_tokens, num_experts).launch(
            **self.launch_config(num_tokens=num_tokens, num_experts=num_experts), stream=stream
        )

    @cute.jit
    def bucket_of(self, ids: cute.Tensor, route: Int32, end: Int32, live: Int32) -> Int32:
        """The bucket of ``route``, or ``buckets`` (matches nothing real) past ``end``."""
        b = Int32(self.buckets)
        if route < end:
            e = ids[route]
            b = Int32(self.e_cap)
            if e >= 0 and e < live:
                b = e
        return b

    @cute.kernel
    def kernel(self, scratch: cute.Pointer, route_ids: cute.Pointer, num_tokens: Int32, num_experts: Int32):
        tid, _, _ = cute.arch.thread_idx()
        lane = tid % 32
        warp = tid // 32
        nb = self.buckets
        bm = self.block_m
        routes, live, blocks_bound = scratch_bounds(
            num_tokens, num_experts, topk=self.topk, block_m=bm, e_cap=self.e_cap
        )
        rows_base = blocks_bound + HEADER_WORDS

        out = self.tensor(scratch, HEADER_WORDS + blocks_bound * (1 + bm))
        ids = self.tensor(route_ids, cutlass.max(routes, Int32(1)))
        # One allocation of exactly the spec's dynamic shared memory, carved by hand.
        rw = self.row_words
        words = cutlass.memory.SmemAllocator().allocate_array(Int32, self.static.smem // 4, byte_alignment=16)
        # hist[w, b]: routes of warp w's segment in bucket b; later warp w's cursor in bucket b.
        hist = cute.make_tensor(words, cute.make_layout((self.warps, nb), stride=(rw, 1)))
        count = self.tensor(words + self.warps * rw, nb)
        first_block = self.tensor(words + (self.warps + 1) * rw, nb)

        for i in range(tid, self.warps * nb, self.cta_threads):
            hist[i // nb, i % nb] = 0
        cute.arch.sync_threads()

        # Pass 1: per-warp histograms over contiguous segments, 32 routes at a time.
        seg = (routes + self.warps - 1) // self.warps
        begin = cutlass.min(warp * seg, routes)
        end = cutlass.min(begin + seg, routes)
        for base in range(begin, end, 32):
            b = self.bucket_of(ids, base + lane, end, live)
            peers = cute.arch.match_sync(0xFFFFFFFF, b)
            lower = peers & cute.arch.lanemask_lt()
            if base + lane < end and lower == Uint32(0):
                hist[warp, b] = hist[warp, b] + Int32(cute.arch.popc(peers))
            cute.arch.sync_warp()
        cute.arch.sync_threads()

        # Per bucket: totals, and each warp's offset inside the bucket (exclusive over warps).
        for b in range(tid, nb, self.cta_threads):
            total = Int32(0)
            for w in cutlass.range_constexpr(self.warps):
                c = hist[w, b]
                hist[w, b] = total
                total = total + c
            count[b] = total
        cute.arch.sync_threads()

        # Warp 0 scans blocks per bucket: lane l owns buckets [l * per_lane, (l + 1) * per_lane).
        if warp == 0:
            local = Int32(0)
            for i in cutlass.range_constexpr(self.per_lane):
                b = lane * self.per_lane + i
                if b < nb:
                    local = local + (count[b] + bm - 1) // bm
            inclusive = local
            for d in cutlass.range_constexpr(5):
                up = cute.arch.shuffle_sync_up(inclusive, 1 << d)
                if lane >= (1 << d):
                    inclusive = inclusive + up
            start = inclusive - local
            for i in cutlass.range_constexpr(self.per_lane):
                b = lane * self.per_lane + i
                if b < nb:
                    first_block[b] = start
                    start = start + (count[b] + bm - 1) // bm
            if lane == 31:
                out[0] = inclusive
                out[1] = routes - count[nb - 1]
                out[2] = count[nb - 1]
                out[3] = 0
        cute.arch.sync_threads()

        # Per bucket: absolute cursors, the block -> expert map, and padding rows set to -1.
        for b in range(tid, nb, self.cta_threads):
            first = first_block[b]
            total = count[b]
            nblocks = (total + bm - 1) // bm
            row0 = first * bm
            for w in cutlass.range_constexpr(self.warps):
                hist[w, b] = hist[w, b] + row0
            expert = b
            if b == nb - 1:
                expert = -1
            for i in range(nblocks):
                out[HEADER_WORDS + first + i] = expert
            for i in range(total, nblocks * bm):
                out[rows_base + row0 + i] = -1
        cute.arch.sync_threads()

        # Pass 2: the same segments again; each route lands at its cursor plus its rank among
        # the lower lanes of its bucket, so buckets keep ascending route order.
        for base in range(begin, end, 32):
            r = base + lane
            b = self.bucket_of(ids, r, end, live)
            peers = cute.arch.match_sync(0xFFFFFFFF, b)
            lower = peers & cute.arch.lanemask_lt()
            cursor = Int32(0)
            if r < end:
                cursor = hist[warp, b]
            cute.arch.sync_warp()
            if r < end:
                out[rows_base + cursor + Int32(cute.arch.popc(lower))] = r
                if lower == Uint32(0):
                    hist[warp, b] = cursor + Int32(cute.arch.popc(peers))
            cute.arch.sync_warp()
