"""``moe.w4a16``: int4-weight x bf16/fp16-activation grouped GEMM over routed tokens.

``out[t, j, :] = round_once(a[t] @ dequant(w[e]).T)`` for every route ``r = t * topk + j`` with
``e = route_ids[t, j]`` valid, where ``dequant(w)[n, k] = int4(w)[n, k] * s[n, k // group]``,
products are accumulated in fp32 by tensor-core MMAs and the sum is rounded once (to nearest
even) to the output dtype. Weights ``w[e_cap, n, k / 2]`` (u8) hold two signed int4 per byte,
in the byte order ``w_layout`` names (``nk`` rows, or ``n64k128`` atoms whose nibbles are in
MMA lane order, see :mod:`b12x_aot.contract.w4a16_layout`: the same bits either way, but for
decode tiles' last fp32 bits). Scales ``s[e_cap, n, k / group]`` are in the activation dtype.
Rows of invalid routes are exact zeros and no weight is read for them. Only ``out`` is
written.

The GEMM walks the blocks that ``moe.route_pack`` wrote into ``scratch`` (see
:mod:`..route_pack` for the layout); it must be launched with the same ``num_tokens``. Grid:
``(max_blocks * k_ctas, n / tile_n)``, read in launch order: with ``x' = x // k_ctas``, CTA
``L = x' + y * max_blocks`` computes the ``block_m x tile_n`` tile ``L % (n / tile_n)`` of
block ``L // (n / tile_n)`` (its k share ``x % k_ctas``: see the cluster split below), or fills
its rows with zeros when the block is a zero-bucket block (or names an expert at or past
``min(num_experts, e_cap)``); CTAs past the blocks used return at once. With ``tail_rows``
(sm_90a wgmma tiles), an expert's last block of at most ``tail_rows`` real rows rides with the
block before it: that block's CTAs load and multiply ``block_m + tail_rows`` rows (the ring
holds that many) and store both blocks' rows, and the last block's CTAs return at once
(:meth:`W4A16.rows_reached`). An expert's blocks are consecutive, so its CTAs run close
together and its weights are read once per block fewer; the wgmmas of each row are the same,
so the same bits. It pays where many experts end on a short block and costs a little where
none do, so the op picks it by the expected share of such experts (``tail_share`` in
``ops/moe_w4a16_tiles.yaml``; the measurements are in ``docs/benchmarks.md``).

Per CTA: the block's ``tile_n x k / group`` scale slab is copied to shared memory once, then
``block_m`` (``+ tail_rows``) ``x tile_k`` activation rows (gathered by route, padding rows
skipped) and the ``tile_n x tile_k / 2`` packed weights stream through a ``stages``-deep ``cp.async`` ring
(decode tiles on ``nk`` weights load their few activation rows into registers one k-tile ahead
and store them in the k order of the cheaper dequant; on ``n64k128`` each 4-byte word is copied
straight to its MMA lane's place; see :mod:`._copies`). With ``w_copy == "bulk"`` (``n64k128``
decode tiles, ``tile_k`` 128) a k-tile's weights are whole atoms, one contiguous 4 KiB per 64-row
band: one thread of the k-part copies each by ``cp.async.bulk`` onto the slot's mbarrier, which
the part waits on before computing it; the compute reads the atom in its global order. Fewer
instructions and no per-thread 16-byte requests: faster than the cp.async twin, except in
launches of one or two CTAs per SM, where the bulk copy's longer latency shows (N 256 / N 384
at 1 token without a cluster, tiles the op does not pick there; see
``ops/moe_w4a16_tiles.yaml`` and ``docs/benchmarks.md``). With ``copy_warps`` 4 (the 256-wide sm_90a wgmma tile) a third
warpgroup past the ``cta_threads`` compute threads issues every copy and keeps only a few
registers (``setmaxnreg``: the two compute warpgroups get the rest); the compute warpgroups
wait on each slot's ``full`` mbarrier (its copiers' ``cp.async`` arrivals) and release it on
its ``empty`` one once the wgmmas that read it are done, so no CTA barrier per k-tile holds
them in step, and their wgmmas are those of the ``copy_warps`` 0 twin: the same bits
(:meth:`._block.BlockGemm.split_roles`). The tensor-core operand is
``round_to_activation_dtype(int4 * s)`` (:mod:`._dequant`), except on decode tiles with
``group % tile_k == 0``, where the exact int4 is the operand and each k-tile's fp32 partial sum
takes its scale in fp32. Two k-loops, chosen by arch and params:

- sm_90a tiles with ``tile_k == 64``, ``stages >= 3``, ``split_k == k_ctas == 1``, whole m64 chunks per
  warpgroup and a ring that can hold the output tile (its epilogue stages it there): ``wgmma``
  with the weights as the register operand (:mod:`._wgmma`);
- everything else, every arch: warp-level ``mma.sync`` (:mod:`._mma`).

Split-k (``split_k > 1``, the ``mma.sync`` loop): the CTA's threads form ``split_k`` k-parts of
``cta_threads / split_k``; part ``p`` walks k-tiles ``[p, p + 1) * k / tile_k / split_k`` with its
own ring and named barrier, so a launch of a few tiles (one token routes to a handful of
experts) keeps several k-streams per SM in flight. Part 0 then adds parts 1, 2, ... to its fp32
sums, in that order, through shared memory, and stores. Deterministic; the association differs
from ``split_k == 1`` (a sum of per-part sums).

Cluster split (``k_ctas > 1``, the ``mma.sync`` loop): a launch of fewer tiles than SMs leaves
most SMs idle, and a tile's k-loop then runs on one SM's issue slots. So the grid's x holds
``k_ctas`` CTAs per block, one cluster, each walking ``k / k_ctas`` with its own parts; after
their k-loops (a cluster barrier), CTAs 1, 2, ... store their summed parts into CTA 0's drained
ring through distributed shared memory, and after a second barrier CTA 0 adds them in rank
order and stores. Deterministic, a further association: ``((cta 0's parts) + cta 1's) + ...``.

CTA-size invariance: in both loops, each accumulator element receives the same MMAs, on the
same operand values, in the same k order, whatever ``cta_threads`` is; only which warp issues
them changes. So variants that differ only in ``cta_threads`` give bit-identical outputs
(``n64k128`` decode tiles run their MMAs transposed, weights as A, at every thread count: see
:meth:`~._mma_steps.KtileMma.compute_swapped`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from b12x_aot.contract import Geometry, StaticGeometry

from .._base import AotKernel, dsl_dtype
from ..route_pack import HEADER_WORDS, scratch_bounds, scratch_words
from ._block import BlockGemm
from ._copies import TileCopies
from ._layout import RingLayout, WeightOrder
from ._mma import MmaSyncMainloop
from ._params import W4A16Params, smem_bytes
from ._wgmma import WgmmaMainloop

__all__ = ["W4A16", "W4A16Params", "smem_bytes"]


class W4A16(AotKernel):
    """The ``moe.w4a16`` kernel, as the spec names it: ``W4A16(geometry, static, **params)``.

    ``params`` become a :class:`W4A16Params` (which checks them); the launch must then have
    ``cta_threads + 32 * copy_warps`` threads, clusters of ``k_ctas`` CTAs along x and the
    shared memory of :func:`smem_bytes`, else ``ValueError`` names what differs. The pieces
    are built once, here, from the params: the ring's layout, the copies, the two mainloops
    and the block tile that runs one of them."""

    def __init__(self, geometry: Geometry, static: StaticGeometry, **params: Any) -> None:
        p = W4A16Params(**params)
        super().__init__(geometry, static, **asdict(p))
        self.p = p
        self._check_launch()
        ring = RingLayout(block_m=p.block_m, tile_n=p.tile_n, tile_k=p.tile_k, swapped=p.swapped, bulk=p.bulk)
        self.copies = TileCopies(p, ring, WeightOrder(k=p.k, w_layout=p.w_layout))
        wgmma = WgmmaMainloop(p, ring, self.copies) if p.wgmma_fits else None
        self.block = BlockGemm(p, static.smem, self.copies, MmaSyncMainloop(p, ring, self.copies), wgmma)
        self.output = dsl_dtype(p.output)

    def _check_launch(self) -> None:
        """The spec's launch against the params: block, cluster and shared memory."""
        p, static = self.p, self.static
        want = smem_bytes(self.params)
        problems = [
            rule
            for failed, rule in (
                (
                    tuple(static.block) != (p.block_threads, 1, 1),
                    "launch.block == [cta_threads + 32 * copy_warps, 1, 1]",
                ),
                # The rank is x % k_ctas and the reduction targets cluster rank 0: only a launch in
                # clusters of exactly k_ctas CTAs along x sums every k share.
                ((static.cluster or (1, 1, 1)) != (p.k_ctas, 1, 1), "launch.cluster == [k_ctas, 1, 1]"),
                (static.smem != want, f"launch.smem == {want} B"),
            )
            if failed
        ]
        if problems:
            raise ValueError(
                f"moe.w4a16 launch breaks {'; '.join(problems)} (got block {static.block}, cluster "
                f"{static.cluster}, smem {static.smem} B; cta_threads={p.cta_threads}, "
                f"copy_warps={p.copy_warps}, k_ctas={p.k_ctas})"
            )

    def uses_wgmma(self) -> bool:
        """Whether the tile runs the sm_90a wgmma loop (:attr:`W4A16Params.wgmma_fits`), else
        ``mma.sync``. Call while tracing: it reads the arch being compiled for."""
        return self.p.wgmma_fits and self.target_arch() == "sm_90a"

    @cute.jit
    def __call__(
        self,
        out: cute.Pointer,
        a: cute.Pointer,
        w: cute.Pointer,
        scales: cute.Pointer,
        scratch: cute.Pointer,
        num_tokens: Int32,
        num_experts: Int32,
        stream: cuda.CUstream,
    ):
        # One CTA per SM is enough to lower: ptxas then never trades spills for occupancy.
        self.kernel(out, a, w, scales, scratch, num_tokens, num_experts).launch(
            **self.launch_config(num_tokens=num_tokens, num_experts=num_experts),
            min_blocks_per_mp=1,
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        out: cute.Pointer,
        a: cute.Pointer,
        w: cute.Pointer,
        scales: cute.Pointer,
        scratch: cute.Pointer,
        num_tokens: Int32,
        num_experts: Int32,
    ):
        p = self.p
        wgmma = self.uses_wgmma()
        tid, _, _ = cute.arch.thread_idx()
        # CTAs start in launch order, x fastest: walk a block's n tiles in a row, so the
        # block's gathered activation rows stay hot in L2 for its tiles, an expert's weight rows
        # are read in address order, and the grid's empty trailing blocks start last.
        bx, by, _ = cute.arch.block_idx()
        grid_x, _, _ = cute.arch.grid_dim()
        rank = Int32(0)  # in the cluster: a cluster's k_ctas CTAs are consecutive in x
        if cutlass.const_expr(p.k_ctas > 1):
            rank, bx, grid_x = bx % p.k_ctas, bx // p.k_ctas, grid_x // p.k_ctas
        tiles = p.n // p.tile_n
        cta = bx + by * grid_x
        blk, nt = cta // tiles, cta % tiles
        bm = p.block_m
        routes, live, nblk = scratch_bounds(num_tokens, num_experts, topk=p.topk, block_m=bm, e_cap=p.e_cap)
        words = scratch_words(nblk, bm)
        sc = self.tensor(scratch, words)
        m_out = self.vectors(out, p.out_vec, routes * p.n // p.out_vec)
        # The block's expert and its rows' routes are read together (each index is inside the
        # scratch whatever the block holds), ahead of the test on the expert: behind it, the
        # routes would wait for the expert's round trip before the first copy could go out.
        rows = HEADER_WORDS + nblk + blk * bm
        used, expert = sc[0], sc[HEADER_WORDS + blk]
        copier = tid % p.part_threads  # this thread among those that copy
        if cutlass.const_expr(p.copy_warps):  # the copy warpgroup's (the others' go unused)
            copier = cutlass.max(tid - p.cta_threads, Int32(0))
        row_routes = self.copies.block_routes(sc, rows, words - 1, copier)
        if blk < used:
            if expert >= 0 and expert < live:
                reach = Int32(bm)
                if cutlass.const_expr(p.tail_rows > 0):
                    reach = self.rows_reached(sc, blk, rows, expert, nblk)
                if reach > 0:
                    self.block.run(
                        m_out,
                        a,
                        w,
                        scales,
                        sc,
                        rows,
                        reach,
                        row_routes,
                        expert,
                        nt,
                        num_tokens,
                        tid,
                        rank,
                        wgmma,
                    )
            elif rank == 0:  # one CTA of a cluster writes the zeros
                zero = cute.make_rmem_tensor((p.out_vec,), self.output)
                zero.fill(0.0)
                per_row = p.tile_n // p.out_vec
                for i in range(tid, bm * per_row, p.block_threads):
                    route = sc[rows + i // per_row]
                    if route >= 0:
                        col = route * (p.n // p.out_vec) + nt * per_row + i % per_row
                        cute.autovec_copy(zero, m_out[None, col])

    @cute.jit
    def rows_reached(self, sc, blk: Int32, rows: Int32, expert: Int32, nblk: Int32) -> Int32:
        """How many rows of the scratch's row list, from block ``blk``'s first, this CTA computes
        (``tail_rows`` > 0): ``block_m + tail_rows`` when the next block is the expert's last
        and holds at most ``tail_rows`` real rows (real rows come first), 0 when block ``blk``
        is such a block (the block before it computes it), else ``block_m``. An expert's blocks
        are consecutive and only its last holds padding rows. ``nblk``: the scratch's blocks.

        The four words are read at once, at indices clamped into the scratch, and tested
        after: behind branches each read would wait for the one before it."""
        p = self.p
        prev = sc[HEADER_WORDS + cutlass.max(blk - 1, 0)]
        nxt = sc[HEADER_WORDS + cutlass.min(blk + 1, nblk - 1)]
        own_row = sc[rows + p.tail_rows]
        next_row = sc[
            cutlass.min(rows + p.block_m, HEADER_WORDS + nblk + (nblk - 1) * p.block_m) + p.tail_rows
        ]
        reach = Int32(p.block_m)
        if (blk > 0) & (prev == expert) & (own_row < 0):
            reach = Int32(0)
        if (blk + 1 < sc[0]) & (nxt == expert) & (next_row < 0):
            reach = Int32(p.ring_rows)
        return reach
