"""One k-tile of ``moe.w4a16``'s ``mma.sync`` loop: a warp's m16n8k16 MMAs, in ascending k.

Three tile kinds, each with its own operand path (see :mod:`._mma` for the layouts):

- :meth:`KtileMma.compute_rows`: blocks of 32 or more rows; A fragments by ``ldmatrix`` from the
  swizzled row tile, the weights' pairs picked by ``prmt`` (``nk``) or a shift (``n64k128``);
- :meth:`KtileMma.compute_interleaved`: decode blocks on ``nk`` weights; one ``ld.shared.v4``
  per A fragment from the interleaved tile, the weights' k, k + 4 pairs one shift each;
- :meth:`KtileMma.compute_swapped`: decode blocks on ``n64k128`` weights, the roles swapped
  (weights A, tokens B), half the MMAs for a block of at most 8 real rows.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from .._base import dsl_dtype
from .._ptx import ldmatrix_x4
from ._dequant import int4_lane_pair, int4_pair, int4_split_pair, scale_pair, scaled
from ._layout import RingLayout
from ._params import W4A16Params

__all__ = ["KtileMma"]


class KtileMma:
    """The MMAs of one k-tile for a variant's ``params``, reading ring slots laid out as
    ``ring`` says. Accumulators are ``(4, m16 atoms, n8 atoms)`` per warp (swapped: ``(4,
    weight m16 atoms, 2)``)."""

    def __init__(self, params: W4A16Params, ring: RingLayout) -> None:
        self.p, self.ring = params, ring
        self.element = dsl_dtype(params.element)

    @cute.jit
    def compute_rows(
        self,
        kt: Int32,
        slot: Int32,
        acc,
        a_row0: Int32,
        s_wv,
        s_s16,
        mma,
        warp: Int32,
        g: Int32,
        c: Int32,
        sel: Uint32,
        mask: Uint32,
    ):
        """All MMAs of one k-tile for this warp, in ascending k: blocks of 32 or more rows.

        MMA step ``s`` of a 64-wide k-chunk takes k ``[16s, 16s + 16)`` in the natural order:
        A fragments come from ldmatrix, and lane ``(g, c)`` takes byte ``c`` of words ``2s`` and
        ``2s + 1`` of its ``nk`` weight row's 32-byte chunk (each 16-byte half loaded once,
        broadcast), or, in ``n64k128``, its own 8 bytes of the chunk (one load per chunk).
        """
        p = self.p
        tn, qa = p.tile_n, p.a_chunks
        na, ma = p.n8_atoms, p.m16_atoms
        for j in cutlass.range_constexpr(p.tile_k // 64):
            wv = cute.make_rmem_tensor((2 if p.atoms else 4, na), Uint32)
            sp2 = cute.make_rmem_tensor((na,), Uint32)
            for s in cutlass.range_constexpr(4):
                if cutlass.const_expr(p.atoms and s == 0):  # the lane's 8 bytes of each row
                    for at in cutlass.range_constexpr(na):
                        row = warp * p.warp_cols + at * 8 + g
                        cute.autovec_copy(
                            s_wv[None, self.ring.w_lane_piece(slot, j, row, g, c)], wv[None, at]
                        )
                if cutlass.const_expr(not p.atoms and s % 2 == 0):  # the 16-byte half for s, s + 1
                    for at in cutlass.range_constexpr(na):
                        unit = (
                            slot * (tn * p.w_chunks)
                            + j * (tn * 2)
                            + (warp * p.warp_cols + at * 8 + g) * 2
                            + ((s // 2) ^ (g // 4))
                        )
                        cute.autovec_copy(s_wv[None, unit], wv[None, at])
                if cutlass.const_expr(16 * s % min(p.group, 64) == 0):
                    grp = (kt * p.tile_k + 64 * j + 16 * s) // p.group
                    for at in cutlass.range_constexpr(na):
                        v = Uint32(s_s16[(warp * p.warp_cols + at * 8 + g) * p.scale_row + grp])
                        sp2[at] = scale_pair(v)
                afr = cute.make_rmem_tensor((4, ma), Uint32)
                for mi in cutlass.range_constexpr(ma):
                    x = ldmatrix_x4(
                        (a_row0 + (slot * p.ring_rows + mi * 16) * (qa * 16) + j * 128) ^ (s << 5)
                    )
                    for i in cutlass.range_constexpr(4):
                        afr[i, mi] = x[i]
                bfr = cute.make_rmem_tensor((2, na), Uint32)
                for at in cutlass.range_constexpr(na):
                    for e in cutlass.range_constexpr(2):
                        if cutlass.const_expr(p.atoms):
                            q = int4_lane_pair(wv[0, at], wv[1, at], s, e, p.element, mask)
                        else:
                            q = int4_pair(wv[2 * (s % 2) + e, at], sel, p.element, mask)
                        bfr[e, at] = scaled(q, sp2[at], p.element)
                self.mma_step(mma, acc, afr, bfr)

    def mma_step(self, mma, acc, afr, bfr, ma: int | None = None, na: int | None = None):
        """``acc += A x B`` for every (m16, n8) atom pair of this warp's fragments (``ma`` m16
        atoms of A and ``na`` n8 atoms of B, by default the warp's)."""
        p = self.p
        ma, na = ma or p.m16_atoms, na or p.n8_atoms
        a_op = cute.make_tensor(
            cute.recast_ptr(afr.iterator, dtype=self.element),
            cute.make_layout((8, ma, 1), stride=(1, 8, 8 * ma)),
        )
        b_op = cute.make_tensor(
            cute.recast_ptr(bfr.iterator, dtype=self.element),
            cute.make_layout((4, na, 1), stride=(1, 4, 4 * na)),
        )
        cute.gemm(mma, acc, a_op, b_op, acc)

    @cute.jit
    def compute_interleaved(
        self,
        kt: Int32,
        slot: Int32,
        acc,
        s_a32,
        s_wv,
        scale_views,
        mma,
        warp: Int32,
        g: Int32,
        c: Int32,
        mask: Uint32,
    ):
        """All MMAs of one k-tile for this warp, in ascending k: blocks of 16 rows (decode) on
        ``nk`` weights (``n64k128`` decode tiles take :meth:`compute_swapped`).

        Lane ``(g, c)`` takes the 16 contiguous k's ``[16c, 16c + 16)`` of each 64-wide chunk of
        its weight rows (8 bytes, one ld.shared.v2) and, from the interleaved activation tile,
        the same k's of its rows: MMA k-slots ``(2c, 2c + 1)`` of step ``s`` are k ``16c + s``
        and ``16c + s + 4``, slots ``(2c + 8, 2c + 9)`` k ``16c + 8 + s`` and ``16c + 12 + s``,
        identically for A (:meth:`~._copies.TileCopies.pair_rows`) and B.
        """
        p = self.p
        na, ma = p.n8_atoms, p.m16_atoms
        s_s16, s_se = scale_views
        target = acc
        if cutlass.const_expr(p.fp32_scale):
            target = cute.make_rmem_tensor((4, ma, na), Float32)
            target.fill(0.0)
        for j in cutlass.range_constexpr(p.tile_k // 64):
            wq = cute.make_rmem_tensor((2, na), Uint32)
            sp2 = cute.make_rmem_tensor((na,), Uint32)
            for at in cutlass.range_constexpr(na):
                nl = warp * p.warp_cols + at * 8 + g
                cute.autovec_copy(s_wv[None, self.ring.w_lane_piece(slot, j, nl, g, c)], wq[None, at])
                if cutlass.const_expr(not p.fp32_scale):
                    # the group of the lane's 16 contiguous k's
                    v = Uint32(s_s16[nl * p.scale_row + (kt * p.tile_k + 64 * j + 16 * c) // p.group])
                    sp2[at] = scale_pair(v)
            for step in cutlass.range_constexpr(4):
                afr = cute.make_rmem_tensor((4, ma), Uint32)
                for mi in cutlass.range_constexpr(ma):
                    unit = self.ring.a_rows_at(slot, mi, g) + self.ring.a_unit(4 * j + c, step, g)
                    cute.autovec_copy(s_a32[None, unit], afr[None, mi])
                bfr = cute.make_rmem_tensor((2, na), Uint32)
                for at in cutlass.range_constexpr(na):
                    for e in cutlass.range_constexpr(2):
                        q = int4_split_pair(wq[e, at], step, p.element, mask)
                        if cutlass.const_expr(p.fp32_scale):
                            bfr[e, at] = q  # exact int4; the k-tile's sum takes the scale in fp32
                        else:
                            bfr[e, at] = scaled(q, sp2[at], p.element)
                self.mma_step(mma, target, afr, bfr)
        if cutlass.const_expr(p.fp32_scale):
            # The lane's accumulators are columns 2c and 2c + 1 of each atom: one scale each.
            grp = (kt * p.tile_k) // p.group
            for at in cutlass.range_constexpr(na):
                col = warp * p.warp_cols + at * 8 + 2 * c
                s0 = s_se[col * p.scale_row + grp].to(Float32)
                s1 = s_se[(col + 1) * p.scale_row + grp].to(Float32)
                for mi in cutlass.range_constexpr(ma):
                    for e in cutlass.range_constexpr(4):
                        acc[e, mi, at] = acc[e, mi, at] + (s1 if e % 2 else s0) * target[e, mi, at]

    @cute.jit
    def compute_swapped(
        self,
        kt: Int32,
        slot: Int32,
        acc,
        s_a32,
        s_wv,
        scale_views,
        mma,
        warp: Int32,
        g: Int32,
        c: Int32,
        mask: Uint32,
        ntok: cutlass.Constexpr[int],
    ):
        """All MMAs of one k-tile for this warp, decode tiles on ``n64k128`` weights: the roles
        swap, weights are the A operand (m16 atoms of the warp's weight rows) and the block's
        tokens B (``ntok`` n8 atoms), so a block of a few real rows takes half the MMAs.

        Lane ``(g, c)`` dequantizes rows ``g`` and ``g + 8`` of each m16 atom from its own 8
        bytes of their 64-wide chunks (lane order: the A fragment's k ``16s + 2c``, ``+ 1``,
        ``+ 8``, ``+ 9``); the interleaved activation unit of
        :meth:`~._layout.RingLayout.a_lane_word` holds tokens
        ``g`` and ``g + 8`` at those k's, the B fragments of both n8 atoms.
        """
        p = self.p
        mw = p.weight_m16
        s_s16, s_se = scale_views
        fp32 = p.fp32_scale
        target = acc
        if cutlass.const_expr(fp32):
            target = cute.make_rmem_tensor((4, mw, 2), Float32)
            target.fill(0.0)
        for j in cutlass.range_constexpr(p.tile_k // 64):
            wq = cute.make_rmem_tensor((2, 2, mw), Uint32)  # word, row (g, g + 8), m16 atom
            sp2 = cute.make_rmem_tensor((2, mw), Uint32)
            for mi in cutlass.range_constexpr(mw):
                for rr in cutlass.range_constexpr(2):
                    # Written out here and below on purpose: the same sum returned by a helper
                    # method cost the split-k tile a register (129), half its occupancy at 256
                    # threads.
                    row = warp * p.warp_cols + mi * 16 + rr * 8 + g
                    cute.autovec_copy(
                        s_wv[None, self.ring.w_lane_piece(slot, j, row, g, c)], wq[None, rr, mi]
                    )
            for step in cutlass.range_constexpr(4):
                if cutlass.const_expr(not fp32 and 16 * step % min(p.group, 64) == 0):
                    grp = (kt * p.tile_k + 64 * j + 16 * step) // p.group
                    for mi in cutlass.range_constexpr(mw):
                        for rr in cutlass.range_constexpr(2):
                            row = warp * p.warp_cols + mi * 16 + rr * 8 + g
                            sp2[rr, mi] = scale_pair(Uint32(s_s16[row * p.scale_row + grp]))
                bfr = cute.make_rmem_tensor((2, 2), Uint32)  # [g:e0, g:e1, g+8:e0, g+8:e1]
                cute.autovec_copy(
                    s_a32[None, self.ring.a_rows_at(slot, 0, g) + self.ring.a_unit(4 * j + c, step, g)], bfr
                )
                afr = cute.make_rmem_tensor((4, mw), Uint32)
                for mi in cutlass.range_constexpr(mw):
                    for e in cutlass.range_constexpr(2):
                        for rr in cutlass.range_constexpr(2):
                            q = int4_lane_pair(wq[0, rr, mi], wq[1, rr, mi], step, e, p.element, mask)
                            if cutlass.const_expr(not fp32):
                                q = scaled(q, sp2[rr, mi], p.element)
                            afr[2 * e + rr, mi] = q
                self.mma_step(mma, self.token_atoms(target, ntok), afr, bfr, ma=mw, na=ntok)
        if cutlass.const_expr(fp32):
            # Accumulators 0, 1 are weight row g of their m16 atom, 2, 3 row g + 8: one scale each.
            grp = (kt * p.tile_k) // p.group
            for mi in cutlass.range_constexpr(mw):
                for rr in cutlass.range_constexpr(2):
                    row = warp * p.warp_cols + mi * 16 + rr * 8 + g
                    sv = s_se[row * p.scale_row + grp].to(Float32)
                    for ni in cutlass.range_constexpr(ntok):
                        for e in cutlass.range_constexpr(2):
                            acc[2 * rr + e, mi, ni] = (
                                acc[2 * rr + e, mi, ni] + sv * target[2 * rr + e, mi, ni]
                            )

    def token_atoms(self, acc, ntok: int):
        """The first ``ntok`` n8 token atoms of swapped accumulators ``(4, m16 atoms, 2)``."""
        p = self.p
        return cute.make_tensor(
            acc.iterator, cute.make_layout((4, p.weight_m16, ntok), stride=(1, 4, 4 * p.weight_m16))
        )
