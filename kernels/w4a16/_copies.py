"""``moe.w4a16``'s copies: a block's activation rows, packed weights and scale slab into the ring.

Activation rows are gathered by route (padding rows skipped): 16-byte ``cp.async`` copies into
the swizzled row tile, except on decode tiles, which interleave them in the weights' k order
(``nk``: staged in registers one k-tile ahead and paired by ``prmt``, :meth:`TileCopies.pair_rows`;
``n64k128``: each 4-byte word straight to its MMA lane's place). Weights go by 16-byte
``cp.async`` (each 64-wide k-chunk's rows with their 16-byte halves swapped when ``row & 4``),
or with ``w_copy == "bulk"`` one ``cp.async.bulk`` per 64-row band onto the slot's mbarrier.
Where each piece lands is :class:`~._layout.RingLayout`'s; the weights' global order is
:class:`~._layout.WeightOrder`'s.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from b12x_aot.contract import cdiv
from b12x_aot.contract.w4a16_layout import ATOM_K, BAND

from .._ptx import cp_async_4, cp_async_16_l2_256, cp_async_bulk_g2s, prmt
from ._layout import RingLayout, WeightOrder
from ._params import W4A16Params

__all__ = ["TileCopies"]


class TileCopies:
    """The copies of one k-part (or of the copy warps) for a variant's ``params``, into ring
    slots laid out as ``ring`` says, from weights in ``weights``' order."""

    def __init__(self, params: W4A16Params, ring: RingLayout, weights: WeightOrder) -> None:
        self.p, self.ring, self.weights = params, ring, weights

    def a_passes(self, rows: int = 0) -> int:
        """Activation copy passes that cover a tile's first ``rows`` rows (all, when 0)."""
        p = self.p
        return cdiv(rows, p.copiers // p.a_chunks) if rows else p.copy_passes

    def a_piece(self, tid, i: int):
        """Row and 16-byte piece (of ``tile_k / 8``) of the block's activations that copying
        thread ``tid`` loads in pass ``i``: consecutive threads take a row's consecutive pieces."""
        qa = self.p.a_chunks
        return tid // qa + i * (self.p.copiers // qa), tid % qa

    @cute.jit
    def block_routes(self, sc, rows: Int32, last: Int32, tid: Int32):
        """The route of the block row each activation copy pass of part thread ``tid`` takes
        (:meth:`a_piece`), read at an index clamped to the scratch's ``last`` word: rows past
        the block's reach are not used (:meth:`activation_sources`)."""
        row_routes = cute.make_rmem_tensor((self.p.copy_passes,), Int32)
        for i in cutlass.range_constexpr(self.p.copy_passes):
            r, _ = self.a_piece(tid, i)
            row_routes[i] = sc[cutlass.min(rows + r, last)]
        return row_routes

    @cute.jit
    def activation_sources(self, tid: Int32, reach: Int32, row_routes):
        """The 16-byte piece of ``a`` at k-tile 0 that each activation copy pass of copying
        thread ``tid`` takes (:meth:`a_piece`), or -1 where its row is past ``reach`` or padding."""
        p = self.p
        a_src = cute.make_rmem_tensor((p.copy_passes,), Int32)
        for i in cutlass.range_constexpr(p.copy_passes):
            r, q = self.a_piece(tid, i)
            a_src[i] = -1
            if (r < reach) & (row_routes[i] >= 0):
                a_src[i] = (row_routes[i] // p.topk) * (p.k // 8) + q
        return a_src

    @cute.jit
    def copy_slab(self, slab, tid: Int32, stride: cutlass.Constexpr[int]):
        """``cp.async`` the block's ``tile_n x k / group`` scale slab into shared memory, thread
        ``tid`` of ``stride`` taking every ``stride``-th 16-byte chunk (uncommitted: it joins
        k-tile 0's group)."""
        atom_s, g_s, s_s, row0 = slab
        chunks = self.p.scale_chunks
        for i in range(tid, self.p.tile_n * chunks, stride):
            cute.copy(
                atom_s,
                g_s[None, row0 * chunks + i],
                s_s[None, (i // chunks) * (self.p.scale_row // 8) + i % chunks],
            )

    @cute.jit
    def produce(self, reach: Int32, row_routes, copies, slab, full, tid: Int32):
        """The copy warps' loop (``tid``: the thread among them; ``row_routes``: its rows',
        :meth:`block_routes`): the scale slab, then each k-tile into its ring slot once the
        compute warps have released the slot's last use, each thread arriving on the slot's
        ``full`` barrier when its copies land. The copies land before the threads exit."""
        atom_a, g_a, s_a, _, _, g_w, s_w, w_src, _ = copies
        a_src = self.activation_sources(tid, reach, row_routes)
        self.copy_slab(slab, tid, self.p.copiers)
        stages = self.p.stages
        for kt in range(self.p.part_ktiles):
            slot = kt % stages
            if kt >= stages:
                cute.arch.mbarrier_wait(full + stages + slot, (kt // stages + 1) % 2)
            self.issue(kt, slot, atom_a, g_a, s_a, a_src, None, g_w, s_w, w_src, None, tid)
            cute.arch.cp_async_mbarrier_arrive_noinc(full + slot)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)

    @cute.jit
    def issue(
        self,
        kt: Int32,
        slot: Int32,
        atom_a,
        g_a,
        s_a,
        a_src,
        staged,
        g_w,
        s_w,
        w_src,
        mbar,
        tid: Int32,
        rows: cutlass.Constexpr[int] = 0,
    ):
        """Fill ring slot ``slot`` with k-tile ``kt``: ``cp.async`` copies, except the activations
        of interleaved ``nk`` tiles, which ``staged`` holds (and then loads k-tile ``kt + 1``
        into). Interleaved ``n64k128`` tiles copy each activation word unchanged to its lane's
        place (:meth:`~._layout.RingLayout.a_lane_word`) by a 4-byte ``cp.async``, in the
        k-tile's commit group. Bulk-copied weights (``w_copy == "bulk"``) go by the part's
        thread 0, one copy per band, on slot ``slot``'s mbarrier (``mbar + slot``). ``rows``:
        when set, the tile's rows from there on are padding, and their copy passes are left out."""
        p = self.p
        qa = p.a_chunks
        if cutlass.const_expr(p.interleave and p.atoms):
            for i in cutlass.range_constexpr(p.copy_passes):
                r, q = self.a_piece(tid, i)
                if a_src[i] >= 0:
                    src = g_a[None, a_src[i] + kt * qa].iterator.toint()
                    for s in cutlass.range_constexpr(4):
                        cp_async_4((s_a.iterator + self.ring.a_lane_word(slot, r, q, s)).toint(), src + 4 * s)
        elif cutlass.const_expr(p.interleave):
            # Only warps over real rows take this branch: decode blocks mostly hold one or two.
            top = a_src[0]
            for i in cutlass.range_constexpr(1, p.copy_passes):
                top = cutlass.max(top, a_src[i])
            if cute.arch.vote_any_sync(top >= 0):
                self.pair_rows(slot, staged, s_a, a_src, tid)
                if (kt + 1) % p.part_ktiles != 0:  # k-tile kt + 1 is in this k-part too
                    self.stage_rows(kt + 1, staged, g_a, a_src)
        else:
            for i in cutlass.range_constexpr(self.a_passes(rows)):
                r, q = self.a_piece(tid, i)
                if a_src[i] >= 0:
                    cute.copy(
                        atom_a,
                        g_a[None, a_src[i] + kt * qa],
                        s_a[None, (slot * p.ring_rows + r) * qa + (q ^ (r % 8))],
                    )
        if cutlass.const_expr(p.bulk):
            self.issue_bulk(kt, slot, g_w, s_w, w_src, mbar, tid)
        else:
            self.issue_weights(kt, slot, g_w, s_w, w_src, tid)

    @cute.jit
    def issue_bulk(self, kt: Int32, slot: Int32, g_w, s_w, w_src, mbar, tid: Int32):
        """Bulk-copy k-tile ``kt``'s weight atoms (one per 64-row band) into slot ``slot``, in
        their global order (see :meth:`~._layout.RingLayout.w_lane_piece`), completing on the
        slot's mbarrier."""
        if tid == 0:
            tn = self.p.tile_n
            bands, atom = tn // BAND, BAND * ATOM_K // 2
            # The part's reads of this slot (k-tile kt - stages, before the part barrier) come
            # before the async proxy's writes into it.
            cute.arch.fence_proxy("async.shared", space="cta")
            bar = mbar + slot
            cute.arch.mbarrier_arrive_and_expect_tx(bar, bands * atom)
            at = bar.toint()
            dst = s_w[None, slot * (tn * self.p.w_chunks)].iterator.toint()
            for b in cutlass.range_constexpr(bands):
                src = g_w[None, w_src + self.weights.unit(b * BAND, kt * self.p.w_chunks)].iterator.toint()
                cp_async_bulk_g2s(dst + b * atom, src, atom, at)

    @cute.jit
    def issue_weights(self, kt: Int32, slot: Int32, g_w, s_w, w_src, tid: Int32):
        """``cp.async`` k-tile ``kt``'s weights into slot ``slot``, 16 bytes per copy."""
        p = self.p
        qw, tn = p.w_chunks, p.tile_n
        # Weight copy i of this thread: 16-byte piece tid % qw of row tid // qw + i * rows. rows
        # is a multiple of 8, so every copy has the same piece and swizzle: one address pair per
        # k-tile plus constant offsets.
        total, rows, copiers = tn * qw, p.copiers // qw, p.copiers
        n0, qq = tid // qw, tid % qw
        dst0 = s_w[
            None, slot * total + (qq // 2) * (tn * 2) + n0 * 2 + ((qq % 2) ^ ((n0 // 4) % 2))
        ].iterator.toint()
        src0 = g_w[None, w_src + self.weights.unit(n0, kt * qw + qq)].iterator.toint()
        for i in cutlass.range_constexpr(cdiv(total, copiers)):
            dst, src = dst0 + i * rows * 32, src0 + self.weights.unit(i * rows, 0) * 16
            if cutlass.const_expr(total % copiers == 0):
                cp_async_16_l2_256(dst, src)
            else:
                if tid + i * copiers < total:
                    cp_async_16_l2_256(dst, src)

    @cute.jit
    def stage_rows(self, kt: Int32, staged, g_a, a_src):
        """Load this thread's 16-byte pieces of k-tile ``kt``'s activation rows into ``staged``
        (interleaved ``nk`` tiles: :meth:`pair_rows` stores them one k-tile later, so in the
        k-loop the load's latency hides behind a k-tile of MMAs; the prologue waits for its
        two)."""
        for i in cutlass.range_constexpr(self.p.copy_passes):
            if a_src[i] >= 0:
                cute.autovec_copy(g_a[None, a_src[i] + kt * self.p.a_chunks], staged[None, i])

    @cute.jit
    def pair_rows(self, slot: Int32, staged, s_a, a_src, tid: Int32):
        """Store the staged activation pieces into ring slot ``slot``, interleaved, in the k
        order of the ``nk`` weights (see :meth:`~._mma_steps.KtileMma.compute_interleaved`).

        Piece ``q`` of row ``r`` is k ``[8q, 8q + 8)``, words ``x0..x3``; its operand words are
        ``(k + s, k + s + 4)`` for ``s < 4``, one ``prmt`` each, stored where
        :meth:`~._layout.RingLayout.a_word` says. (``n64k128`` tiles need no pairing:
        :meth:`issue` copies each word straight to its lane's place.)
        """
        for i in cutlass.range_constexpr(self.p.copy_passes):
            r, q = self.a_piece(tid, i)
            if a_src[i] >= 0:
                for s in cutlass.range_constexpr(4):
                    word = prmt(staged[s // 2, i], staged[s // 2 + 2, i], 0x5410 if s % 2 == 0 else 0x7632)
                    s_a[self.ring.a_word(slot, r, q, s)] = word
