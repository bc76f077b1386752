"""``moe.w4a16``'s mainloop on warp-level ``mma.sync`` m16n8k16 (every arch): the k-loop, the
sums of k-parts and CTAs, and the epilogues. One k-tile's MMAs are :mod:`._mma_steps`'.

Warps split ``tile_n`` only: each warp owns every row of the block and ``tile_n / warps``
columns, and every warp of a k-part walks the same k-slices in the same order, so each
accumulator gets the same MMAs whatever ``cta_threads`` is. Activations are the A operand,
dequantized weights B, except on swapped decode tiles (below). With ``split_k`` k-parts, part 0
adds the others' sums in part order; with ``k_ctas`` CTAs per cluster, CTA 0 then adds the
others' in rank order.

- Decode blocks (``block_m == 16``), interleaved: lane ``(g, c)`` takes, for each 64-wide
  k-chunk, the 16 contiguous k's ``[16c, 16c + 16)`` of its weight rows (8 bytes, one
  ``ld.shared.v2``: words ``w0``, ``w1``) and of its activation rows. Operand pairs are k and
  k + 4, the nibbles one shift brings to the low bits of a word's halves: MMA k-slots
  ``(2c, 2c + 1)`` of step ``s`` are k ``16c + s`` and ``16c + s + 4`` (nibbles ``s``, ``s + 4``
  of ``w0``), slots ``(2c + 8, 2c + 9)`` the same of ``w1`` (k + 8). The activation rows are
  paired alike on their way to shared memory (a ``prmt`` per word, staged in registers one
  k-tile ahead: a block holds few real rows) and stored row-interleaved, so one
  ``ld.shared.v4`` is an A fragment. That is for ``nk`` weights; ``n64k128`` weights are in lane
  order (:mod:`b12x_aot.contract.w4a16_layout`): the lane's 8 bytes hold its k's of the natural
  MMA slots as (k, k + 1) pairs, still one shift each, the activation words need no pairing
  (each goes unchanged to its lane's place by a 4-byte ``cp.async``, in the k-tile's commit
  group, with the weights unless those arrive by bulk copies), and the MMA roles swap
  (:meth:`~._mma_steps.KtileMma.compute_swapped`; a warp must hold whole m16 atoms of weight rows, ``tile_n / warps`` a multiple of 16): dequantized weights
  are A, the block's tokens B, and a block of at most 8 real rows (most decode blocks)
  takes one n8 token atom, half the MMAs; each output element still sums the same products in
  the same MMA k-slots as the untransposed loop did (the same bits). When
  ``group % tile_k == 0`` the exact int4 is the operand and each k-tile's fp32 partial sum
  takes its scale in fp32.
- Larger blocks, rows: natural k order; A fragments by ``ldmatrix`` from the swizzled row tile,
  and lane ``(g, c)`` takes byte ``c`` of each word of its ``nk`` weight row (one broadcast
  16-byte load per two steps, a ``prmt`` per pair), or its own 8 bytes of an ``n64k128`` row
  (one load per 64 k, a shift per pair).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from .._base import AotKernel, dsl_dtype
from .._ptx import st_cluster_f32
from ._copies import TileCopies
from ._dequant import pair_selector
from ._layout import RingLayout
from ._mma_steps import KtileMma
from ._params import W4A16Params

__all__ = ["MmaSyncMainloop"]


def _unravel(e: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The column-major coordinate of flat index ``e`` in ``shape``."""
    coord = []
    for extent in shape:
        coord.append(e % extent)
        e //= extent
    return tuple(coord)


class MmaSyncMainloop:
    """The ``mma.sync`` k-loop, the sums of k-parts and CTAs, and the epilogue, for a variant's
    ``params``: its k-tiles' copies are ``copies``', its MMAs read ring slots laid out as
    ``ring`` says."""

    def __init__(self, params: W4A16Params, ring: RingLayout, copies: TileCopies) -> None:
        self.p, self.copies = params, copies
        self.steps = KtileMma(params, ring)
        self.output = dsl_dtype(params.output)
        # Accumulators per thread: (4, m16 atoms, n8 atoms), swapped (4, weight m16 atoms, 2).
        self.acc_shape = (
            (4, params.weight_m16, 2) if params.swapped else (4, params.m16_atoms, params.n8_atoms)
        )

    def tiles_ahead(self) -> int:
        """k-tiles in flight ahead of the one computing: the ring's other slots."""
        return self.p.stages - 1

    @cute.jit
    def run(self, tile, views, copies, where):
        """k-loop of warp-level ``mma.sync`` and the epilogue of ``tile`` (an
        :class:`~._tile.OutTile`; every arch, every tile the wgmma loop does not take). ``where``: this thread's index in its k-part, the part, the
        CTA's rank in its cluster, the part's first k-tile, and the start of shared memory (for
        the parts' and CTAs' sums). ``views`` ends with the dequant's nibble mask register
        (:func:`~._dequant.nibble_mask`)."""
        p = self.p
        a_row0, s_a32, s_wv, s_s16, s_se, mma, mask = views
        tid, part, rank, k0, smem = where
        lane, warp = tid % 32, tid // 32
        g, c = lane // 4, lane % 4
        sel = Uint32(pair_selector(c))  # this lane's byte of each weight word
        shape = self.acc_shape
        acc = cute.make_rmem_tensor(shape, Float32)
        acc.fill(0.0)
        state = (a_row0, s_a32, s_wv, s_s16, s_se, mma, copies, tid, part, k0, warp, g, c, sel, mask)
        if cutlass.const_expr(p.swapped):
            # Tokens are the n8 operand: a block of at most 8 real rows needs one n8 atom (real
            # rows come first in a block, see route_pack).
            if tile.sc[tile.rows + 8] >= 0:
                self.kloop(acc, state, 2)
            else:
                self.kloop(acc, state, 1)
        else:
            self.kloop(acc, state, 0)  # no token atoms: tokens are the m16 operand
        if cutlass.const_expr(p.split_k > 1):
            self.add_parts(acc, shape, part, tid, smem)
        if cutlass.const_expr(p.k_ctas > 1):
            self.add_ctas(acc, shape, part, rank, tid, smem)
        if part == 0 and rank == 0:
            if cutlass.const_expr(p.swapped):
                self.store_swapped(tile, acc, warp, g, c)
            else:
                self.store_mma(tile, acc, warp, g, c)

    @cute.jit
    def kloop(self, acc, state, ntok: cutlass.Constexpr[int]):
        """The k-loop; ``ntok``: n8 token atoms of a swapped decode tile (0 for the others)."""
        p = self.p
        a_row0, s_a32, s_wv, s_s16, s_se, mma, copies, tid, part, k0, warp, g, c, sel, mask = state
        stages = p.stages
        mbar = copies[-1]  # issue()'s last copy argument: the part's slot mbarriers (bulk weights)
        for i in range(p.part_ktiles):
            cute.arch.cp_async_wait_group(stages - 2)
            self.part_sync(part)
            nxt = i + stages - 1
            if nxt < p.part_ktiles:
                self.copies.issue(k0 + nxt, nxt % stages, *copies, tid)
            cute.arch.cp_async_commit_group()
            if cutlass.const_expr(p.bulk):  # k-tile i's weights: on its slot's mbarrier
                cute.arch.mbarrier_wait(mbar + i % stages, (i // stages) % 2)
            if cutlass.const_expr(p.swapped):
                self.steps.compute_swapped(
                    k0 + i, i % stages, acc, s_a32, s_wv, (s_s16, s_se), mma, warp, g, c, mask, ntok
                )
            elif cutlass.const_expr(p.interleave):
                self.steps.compute_interleaved(
                    k0 + i, i % stages, acc, s_a32, s_wv, (s_s16, s_se), mma, warp, g, c, mask
                )
            else:
                self.steps.compute_rows(
                    k0 + i, i % stages, acc, a_row0, s_wv, s_s16, mma, warp, g, c, sel, mask
                )

    @cute.jit
    def part_sync(self, part: Int32):
        """Barrier of one k-part's threads (the whole CTA when there is one part)."""
        p = self.p
        if cutlass.const_expr(p.split_k == 1):
            cute.arch.sync_threads()
        else:
            cute.arch.barrier(barrier_id=part + 1, number_of_threads=p.part_threads)

    def sum_word(self, shape: tuple, first: int, i, e: int, tid):
        """Word ``e`` of stored sum ``i`` (a k-part's or a CTA's, counted from 0) past word
        ``first`` of the sums area: each sum is ``count * threads`` words, lanes consecutive, so
        a thread's accumulators meet the same thread's of every other part or CTA."""
        p = self.p
        return first + (i * (shape[0] * shape[1] * shape[2]) + e) * p.part_threads + tid

    @cute.jit
    def add_sums(self, acc, shape: cutlass.Constexpr[tuple], smem, first: int, total: int, tid: Int32):
        """``acc`` (of ``shape``) += stored sums ``0 .. total - 1`` past word ``first`` of
        ``smem``, in that order."""
        p = self.p
        count = shape[0] * shape[1] * shape[2]
        sums = AotKernel.tensor(cute.recast_ptr(smem, dtype=Float32), first + total * count * p.part_threads)
        for i in cutlass.range_constexpr(total):
            for e in cutlass.range_constexpr(count):
                at = _unravel(e, shape)
                acc[at] = acc[at] + sums[self.sum_word(shape, first, i, e, tid)]

    @cute.jit
    def add_parts(self, acc, shape: cutlass.Constexpr[tuple], part: Int32, tid: Int32, smem):
        """Part 0's accumulators (of ``shape``) += part 1's, part 2's, ..., in that order, through
        shared memory (the drained rings)."""
        p = self.p
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        count = shape[0] * shape[1] * shape[2]
        sums = AotKernel.tensor(
            cute.recast_ptr(smem, dtype=Float32), (p.split_k - 1) * count * p.part_threads
        )
        if part > 0:
            for e in cutlass.range_constexpr(count):
                sums[self.sum_word(shape, 0, part - 1, e, tid)] = acc[_unravel(e, shape)]
        cute.arch.sync_threads()
        if part == 0:
            self.add_sums(acc, shape, smem, 0, p.split_k - 1, tid)

    @cute.jit
    def add_ctas(self, acc, shape: cutlass.Constexpr[tuple], part: Int32, rank: Int32, tid: Int32, smem):
        """Rank 0's part-0 accumulators (of ``shape``) += rank 1's, rank 2's, ..., in that order
        (each CTA's parts already added): the others store theirs into rank 0's drained ring,
        past the parts' sums, between two cluster barriers."""
        p = self.p
        cute.arch.cp_async_wait_group(0)
        cute.arch.cluster_arrive()  # every CTA of the cluster is past its k-loop: rings are free
        cute.arch.cluster_wait()
        count = shape[0] * shape[1] * shape[2]
        first = (p.split_k - 1) * count * p.part_threads  # word past the parts' sums
        if part == 0 and rank > 0:
            at = smem.toint() + self.sum_word(shape, first, rank - 1, 0, tid) * 4  # word 0; e follows
            for e in cutlass.range_constexpr(count):
                st_cluster_f32(at + e * p.part_threads * 4, Int32(0), acc[_unravel(e, shape)])
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        if part == 0 and rank == 0:
            self.add_sums(acc, shape, smem, first, p.k_ctas - 1, tid)

    @cute.jit
    def store_mma(self, tile, acc, warp: Int32, g: Int32, c: Int32):
        """The epilogue: round once, store the two adjacent columns of each row this lane holds.
        The rows' routes are read first, at once (why: ``WgmmaMainloop.store_staged``)."""
        p = self.p
        m_out, sc, rows, _, nt = tile
        tn = p.tile_n
        half = AotKernel.vectors(m_out.iterator, 2, cute.size(m_out) // 2)
        y = cute.make_rmem_tensor((2,), self.output)
        routes = cute.make_rmem_tensor((p.m16_atoms, 2), Int32)
        for mi in cutlass.range_constexpr(p.m16_atoms):
            for h in cutlass.range_constexpr(2):
                routes[mi, h] = sc[rows + mi * 16 + h * 8 + g]
        for mi in cutlass.range_constexpr(p.m16_atoms):
            for h in cutlass.range_constexpr(2):
                route = routes[mi, h]
                if route >= 0:
                    for at in cutlass.range_constexpr(p.n8_atoms):
                        col = nt * tn + warp * p.warp_cols + at * 8 + 2 * c
                        y[0] = acc[2 * h, mi, at].to(self.output)
                        y[1] = acc[2 * h + 1, mi, at].to(self.output)
                        cute.autovec_copy(y, half[None, (route * p.n + col) // 2])

    @cute.jit
    def store_swapped(self, tile, acc, warp: Int32, g: Int32, c: Int32):
        """The swapped decode epilogue: accumulator ``2rr + e`` of (m16 atom ``mi``, n8 atom
        ``ni``) is weight row ``16mi + 8rr + g`` of the warp's, token row ``8ni + 2c + e``;
        round once and store each as one element. The four routes are read first, at once
        (why: ``WgmmaMainloop.store_staged``)."""
        p = self.p
        m_out, sc, rows, _, nt = tile
        one = AotKernel.tensor(m_out.iterator, cute.size(m_out))
        routes = cute.make_rmem_tensor((2, 2), Int32)
        for ni in cutlass.range_constexpr(2):
            for e in cutlass.range_constexpr(2):
                routes[ni, e] = sc[rows + ni * 8 + 2 * c + e]
        for ni in cutlass.range_constexpr(2):
            for e in cutlass.range_constexpr(2):
                route = routes[ni, e]
                if route >= 0:
                    for mi in cutlass.range_constexpr(p.weight_m16):
                        for rr in cutlass.range_constexpr(2):
                            col = nt * p.tile_n + warp * p.warp_cols + mi * 16 + rr * 8 + g
                            one[route * p.n + col] = acc[2 * rr + e, mi, ni].to(self.output)
