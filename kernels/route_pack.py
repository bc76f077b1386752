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

Grid: ``max(1, cdiv(R, cta_routes))`` CTAs. CTA ``c`` places the routes of its slice
``[c * cta_routes, (c + 1) * cta_routes)`` and writes the expert entries and padding rows of
the buckets ``b`` with ``b % CTAs == c``; CTA 0 writes the header. Every CTA counts every
route, so each knows, without talking to the others, where every bucket starts and how many
of a bucket's routes precede its slice:

1. each warp counts its contiguous segment of the slice per bucket into its own shared
   histogram row (``match.any`` groups the equal buckets of 32 routes: no atomics, so the
   counts are exact per segment), while the whole CTA counts the routes before and after the
   slice with shared-memory atomic adds (order does not matter for a count);
2. per bucket, a scan over those rows gives the total and each segment's offset inside the
   bucket; one warp scans the buckets' block counts into their first blocks;
3. each warp rescans its segment and scatters route indices: each route lands at its
   segment's cursor plus its rank among the lower lanes of its bucket, so buckets keep
   ascending route order; a thread per bucket writes the CTA's share of expert entries and
   padding rows (a grid of one CTA writes no padding rows there: it first sets every row of
   the used blocks to -1, with coalesced stores, and the scatter overwrites the routes' rows).

Loads run ``UNROLL`` routes ahead per lane, so the passes are bound by memory latency once
per ``UNROLL`` routes. At decode sizes one CTA does it all in a launch latency; at prefill
sizes the slices spread the scattered stores over many SMs.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from b12x_aot.contract import cdiv

from ._base import AotKernel
from ._ptx import red_shared_add_u32

__all__ = ["HEADER_WORDS", "RoutePack", "scratch_bounds", "scratch_words"]

HEADER_WORDS = 4
UNROLL = 8  # routes per lane whose loads a pass keeps in flight
EXTRA_ROWS = 4  # shared rows past the warps': before the slice, after it, counts, first blocks


def scratch_bounds(num_tokens: Int32, num_experts: Int32, *, topk: int, block_m: int, e_cap: int):
    """The scratch bounds, traced, for the kernels that write and read the scratch: the routes
    ``R``, the resident experts ``min(num_experts, e_cap)`` (both clamped at 0) and ``B``."""
    routes = cutlass.max(num_tokens, Int32(0)) * topk
    live = cutlass.min(cutlass.max(num_experts, Int32(0)), Int32(e_cap))
    bound = cdiv(routes, block_m) + cutlass.min(routes, Int32(e_cap + 1))
    return routes, live, bound


def scratch_words(bound, block_m: int):
    """The scratch's 32-bit words for a block bound ``bound`` (:func:`scratch_bounds`): the
    header, one expert per block, then ``block_m`` routes per block."""
    return HEADER_WORDS + bound * (1 + block_m)


class RoutePack(AotKernel):
    def __init__(
        self,
        geometry,
        static,
        *,
        topk: int,
        block_m: int,
        e_cap: int,
        cta_threads: int,
        cta_routes: int,
    ):
        super().__init__(
            geometry,
            static,
            topk=topk,
            block_m=block_m,
            e_cap=e_cap,
            cta_threads=cta_threads,
            cta_routes=cta_routes,
        )
        self.topk = topk
        self.block_m = block_m
        self.e_cap = e_cap
        self.cta_threads = cta_threads
        self.cta_routes = cta_routes
        self.warps = cta_threads // 32
        self.buckets = e_cap + 1  # experts, then the zero bucket
        self.per_lane = cdiv(self.buckets, 32)
        self.row_words = cdiv(self.buckets, 4) * 4  # rows padded to 16 bytes
        need = 4 * (self.warps + EXTRA_ROWS) * self.row_words
        if cta_threads % 32 or cta_routes < 1 or self.static.smem < need:
            raise ValueError(
                f"route_pack needs a multiple of 32 threads, cta_routes >= 1 and {need} B of shared "
                f"memory (got {cta_threads} threads, cta_routes {cta_routes}, {self.static.smem} B)"
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
        """The bucket of ``route``, or ``buckets`` (matches nothing real) at or past ``end``."""
        b = Int32(self.buckets)
        if route < end:
            e = ids[route]
            b = Int32(self.e_cap)
            if e >= 0 and e < live:
                b = e
        return b

    @cute.jit
    def count_range(self, ids: cute.Tensor, begin: Int32, end: Int32, live: Int32, row: Int32, tid: Int32):
        """Add the routes ``[begin, end)`` to the shared histogram row at address ``row``, every
        thread striding over them with ``UNROLL`` loads in flight."""
        step = self.cta_threads
        for base in range(begin + tid, end, step * UNROLL):
            ahead = [self.bucket_of(ids, base + step * u, end, live) for u in range(UNROLL)]
            for u in cutlass.range_constexpr(UNROLL):
                if base + step * u < end:
                    red_shared_add_u32(row + ahead[u] * 4, Uint32(1))

    @cute.kernel
    def kernel(self, scratch: cute.Pointer, route_ids: cute.Pointer, num_tokens: Int32, num_experts: Int32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        lane = tid % 32
        warp = tid // 32
        nb = self.buckets
        bm = self.block_m
        routes, live, blocks_bound = scratch_bounds(
            num_tokens, num_experts, topk=self.topk, block_m=bm, e_cap=self.e_cap
        )
        rows_base = blocks_bound + HEADER_WORDS

        out = self.tensor(scratch, scratch_words(blocks_bound, bm))
        ids = self.tensor(route_ids, cutlass.max(routes, Int32(1)))
        # One allocation of exactly the spec's dynamic shared memory, carved by hand: hist[w, b]
        # (routes of warp w's segment in bucket b; later that segment's cursor in bucket b), then
        # rows of the routes before and after the slice, the bucket totals and first blocks.
        rw = self.row_words
        words = cutlass.memory.SmemAllocator().allocate_array(Int32, self.static.smem // 4, byte_alignment=16)
        hist = cute.make_tensor(words, cute.make_layout((self.warps, nb), stride=(rw, 1)))
        before = self.tensor(words + self.warps * rw, nb)
        after = self.tensor(words + (self.warps + 1) * rw, nb)
        count = self.tensor(words + (self.warps + 2) * rw, nb)
        first_block = self.tensor(words + (self.warps + 3) * rw, nb)

        flat = self.tensor(words, (self.warps + EXTRA_ROWS) * rw)
        for i in range(tid, (self.warps + EXTRA_ROWS) * rw, self.cta_threads):
            flat[i] = 0
        cute.arch.sync_threads()

        # Pass 1: per-warp histograms over contiguous segments of the slice, 32 routes at a time
        # (each lane loads UNROLL routes ahead); atomic counts of the routes outside the slice.
        s0 = cutlass.min(cta * self.cta_routes, routes)
        s1 = cutlass.min(s0 + self.cta_routes, routes)
        seg = (s1 - s0 + self.warps - 1) // self.warps
        begin = cutlass.min(s0 + warp * seg, s1)
        end = cutlass.min(begin + seg, s1)
        self.count_segment(ids, begin, end, live, hist, warp, lane)
        self.count_range(ids, Int32(0), s0, live, before.iterator.toint(), tid)
        self.count_range(ids, s1, routes, live, after.iterator.toint(), tid)
        cute.arch.sync_threads()

        self.segment_offsets(hist, before, after, count, tid)
        cute.arch.sync_threads()
        if warp == 0:
            self.scan_blocks(count, first_block, out, routes, cta, lane)
        cute.arch.sync_threads()
        self.place_buckets(hist, count, first_block, out, rows_base, cta, ctas, tid)
        cute.arch.sync_threads()
        self.scatter_segment(ids, begin, end, live, hist, out, rows_base, warp, lane)

    @cute.jit
    def count_segment(
        self, ids: cute.Tensor, begin: Int32, end: Int32, live: Int32, hist, warp: Int32, lane: Int32
    ):
        """Pass 1: warp ``warp``'s routes ``[begin, end)`` into its histogram row, 32 at a time:
        ``match.any`` groups a round's equal buckets and its lowest lane adds their count (no
        atomics: the counts are exact per segment)."""
        for base in range(begin, end, 32 * UNROLL):
            ahead = [self.bucket_of(ids, base + 32 * u + lane, end, live) for u in range(UNROLL)]
            for u in cutlass.range_constexpr(UNROLL):
                if base + 32 * u < end:  # warp-uniform: skips the rounds past the segment
                    b = ahead[u]
                    peers = cute.arch.match_sync(0xFFFFFFFF, b)
                    lower = peers & cute.arch.lanemask_lt()
                    if base + 32 * u + lane < end and lower == Uint32(0):
                        hist[warp, b] = hist[warp, b] + Int32(cute.arch.popc(peers))
                    cute.arch.sync_warp()

    @cute.jit
    def segment_offsets(self, hist, before, after, count, tid: Int32):
        """Per bucket: the total, and each segment's offset inside the bucket (the routes before
        the slice, then the segments before it)."""
        for b in range(tid, self.buckets, self.cta_threads):
            total = before[b]
            for w in cutlass.range_constexpr(self.warps):
                c = hist[w, b]
                hist[w, b] = total
                total = total + c
            count[b] = total + after[b]

    @cute.jit
    def scan_blocks(self, count, first_block, out, routes: Int32, cta: Int32, lane: Int32):
        """Warp 0 scans blocks per bucket: lane ``l`` owns buckets ``[l * per_lane, (l + 1) *
        per_lane)``; CTA 0's lane 31 writes the header."""
        nb, bm = self.buckets, self.block_m
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
        if cta == 0 and lane == 31:
            out[0] = inclusive
            out[1] = routes - count[nb - 1]
            out[2] = count[nb - 1]
            out[3] = 0

    @cute.jit
    def place_buckets(
        self, hist, count, first_block, out, rows_base: Int32, cta: Int32, ctas: Int32, tid: Int32
    ):
        """Per bucket: absolute cursors; and for this CTA's buckets (b % CTAs == CTA), the
        block -> expert entries and, when there are several CTAs, the padding rows."""
        nb, bm = self.buckets, self.block_m
        for b in range(tid, nb, self.cta_threads):
            first = first_block[b]
            row0 = first * bm
            for w in cutlass.range_constexpr(self.warps):
                hist[w, b] = hist[w, b] + row0
            if b % ctas == cta:
                total = count[b]
                nblocks = (total + bm - 1) // bm
                expert = b
                if b == nb - 1:
                    expert = -1
                for i in range(nblocks):
                    out[HEADER_WORDS + first + i] = expert
                if ctas > 1:
                    for i in range(total, nblocks * bm):
                        out[rows_base + row0 + i] = -1
        if ctas == 1:
            # A lone CTA sets every row of the used blocks to -1, coalesced; pass 2 overwrites
            # the routes' rows after the barrier. At decode sizes most buckets hold one or two
            # routes, and a thread writing its bucket's block_m - 1 padding rows one by one
            # would cost several times the whole pack at large block_m. Only a lone CTA may:
            # nothing orders another CTA's scatter after this fill.
            used = first_block[nb - 1] + (count[nb - 1] + bm - 1) // bm  # = scratch[0]
            for i in range(tid, used * bm, self.cta_threads):
                out[rows_base + i] = -1

    @cute.jit
    def scatter_segment(
        self, ids: cute.Tensor, begin: Int32, end: Int32, live: Int32, hist, out, rows_base: Int32, warp, lane
    ):
        """Pass 2: the same segments again; each route lands at its cursor plus its rank among
        the lower lanes of its bucket, so buckets keep ascending route order."""
        for base in range(begin, end, 32 * UNROLL):
            ahead = [self.bucket_of(ids, base + 32 * u + lane, end, live) for u in range(UNROLL)]
            for u in cutlass.range_constexpr(UNROLL):
                if base + 32 * u < end:  # warp-uniform, as in pass 1
                    r = base + 32 * u + lane
                    b = ahead[u]
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
