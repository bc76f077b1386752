"""One ``moe.w4a16`` CTA's tile of one expert block: shared memory, prologue and mainloop.

The dynamic shared memory is carved once: a ring per k-part (activation tiles of ``block_m +
tail_rows`` rows, then the packed weights), one scale slab, then the mbarriers (one per ring
slot for bulk weight copies; with copy warps a ``full`` and an ``empty`` one). The prologue
copies the scale slab and the first k-tiles; the mainloop (:mod:`._mma` or :mod:`._wgmma`) does
the rest and stores. With copy warps, :meth:`BlockGemm.split_roles` hands the copies to a
warpgroup of their own.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint16, Uint32

from .._base import AotKernel, dsl_dtype
from ._copies import TileCopies
from ._dequant import nibble_mask
from ._mma import MmaSyncMainloop
from ._params import COPY_REGISTERS, W4A16Params
from ._tile import OutTile
from ._wgmma import WgmmaMainloop

__all__ = ["BlockGemm"]


class BlockGemm:
    """The tile of one expert block for a variant's ``params``: ``smem`` bytes of dynamic shared
    memory (the launch's), ``copies`` to fill the ring, and the two mainloops (``wgmma`` is
    None where the tile does not fit it)."""

    def __init__(
        self,
        params: W4A16Params,
        smem: int,
        copies: TileCopies,
        mma: MmaSyncMainloop,
        wgmma: WgmmaMainloop | None,
    ) -> None:
        self.p, self.smem, self.copies, self.mma, self.wgmma = params, smem, copies, mma, wgmma
        self.element = dsl_dtype(params.element)

    @cute.jit
    def run(
        self,
        m_out,
        a,
        w,
        scales,
        sc,
        rows: Int32,
        reach: Int32,
        row_routes,
        expert: Int32,
        nt: Int32,
        num_tokens: Int32,
        tid: Int32,
        rank: Int32,
        wgmma: cutlass.Constexpr[bool],
    ):
        """The ``reach x tile_n`` tile from one expert block's first row: ``block_m`` rows, or
        with the next block's few rows (``reach``; ``row_routes``: the copying thread's rows'
        routes, :meth:`~._copies.TileCopies.block_routes`). ``wgmma``: whether the tile takes
        the wgmma loop (sm_90a, :attr:`~._params.W4A16Params.wgmma_fits`)."""
        p = self.p
        if cutlass.const_expr(p.tail_rows and not wgmma):
            raise ValueError("tail_rows > 0 needs a wgmma tile (sm_90a, see W4A16Params.wgmma_fits)")
        lane = tid % 32
        smem = cutlass.memory.SmemAllocator().allocate_array(Uint8, self.smem, byte_alignment=1024)
        # This thread's k-part, its thread index in the part, and the part's ring.
        part, tid_all, base = Int32(0), tid, smem
        if cutlass.const_expr(p.split_k > 1):
            part, tid = tid // p.part_threads, tid % p.part_threads
            base = smem + cute.assume(part * p.part_ring_bytes, divby=1024)  # keeps the alignment
        k0 = (rank * p.split_k + part) * p.part_ktiles  # the part's first k-tile
        s_a32, s_a, s_w, s_wv = self.ring_views(base)
        mbars, s_s, s_s16, s_se = self.slab_views(smem)
        g_a, atom_a, g_w, g_s, atom_s = self.global_views(a, w, scales, num_tokens)
        mma = cute.make_mma_atom(cute.nvgpu.warp.MmaF16BF16Op(self.element, Float32, (16, 8, 16)))

        row0 = expert * p.n + nt * p.tile_n
        w_src = row0 * (p.k // 32)
        slab = (atom_s, g_s, s_s, row0)
        tile = OutTile(m_out, sc, rows, reach, nt)
        if cutlass.const_expr(p.copy_warps):
            copies = (atom_a, g_a, s_a, None, None, g_w, s_w, w_src, None)
            self.split_roles(tile, row_routes, base, s_wv, s_s16, mbars, copies, slab, num_tokens, tid, wgmma)
        else:
            ahead = self.wgmma.tiles_ahead() if wgmma else self.mma.tiles_ahead()
            feeds = (atom_a, g_a, s_a, g_w, s_w, w_src)
            a_src, staged, mbar = self.prologue(
                k0, feeds, reach, row_routes, slab, mbars, part, tid_all, tid, ahead
            )
            copies = (atom_a, g_a, s_a, a_src, staged, g_w, s_w, w_src, mbar)
            mask = nibble_mask(num_tokens)  # the dequant's nibble mask, held in a register
            if cutlass.const_expr(wgmma):
                self.wgmma.run(tile, base, s_wv, s_s16, copies, tid, mask)
            else:
                # ldmatrix address of step 0: lane 8m + i reads row (m % 2) * 8 + i of an m16 atom, at
                # 16-byte chunk m // 2, swizzled by the row (whose low 3 bits are i). Step s reads chunk
                # 2s + m // 2: the address XOR (s << 5), as rows and the tile base are 128-byte aligned.
                a_row0 = (
                    base.toint()
                    + (((lane // 8) % 2) * 8 + lane % 8) * (p.a_chunks * 16)
                    + (((lane // 16) ^ (lane % 8)) * 16)
                )
                self.mma.run(
                    tile,
                    (a_row0, s_a32, s_wv, s_s16, s_se, mma, mask),
                    copies,
                    (tid, part, rank, k0, smem),
                )

    def ring_views(self, base):
        """A k-part's ring from ``base``. Activations: interleaved (block_m 16), one MMA A
        fragment (swapped: the B fragments of both token atoms) per 16-byte unit, in the
        weights' k order (nk: paired in registers, see ``pair_rows``; n64k128: 4-byte copies,
        see ``issue``), read by one ld.shared.v4 per MMA step; otherwise plain rows of 16-byte
        chunks (chunk q at q ^ (row % 8)), filled by 16-byte cp.async and read by ldmatrix
        (conflict-free thanks to the swizzle). Weights: per 64-wide k-chunk, 32 bytes per row
        n, its 16-byte halves swapped when n & 4: eight consecutive rows' same halves then hit
        distinct banks. Bulk-copied (w_copy bulk): the atoms as they are in global memory, 64
        bytes per row. Returns the activations as 16-byte vectors and as the copies write
        them, and the weights as 16-byte vectors and as the mainloops read them."""
        p = self.p
        stages, tn, qw = p.stages, p.tile_n, p.w_chunks
        s_a32 = AotKernel.vectors(cute.recast_ptr(base, dtype=Uint32), 4, stages * p.ring_rows * p.a_chunks)
        s_a = s_a32
        if p.interleave:
            s_a = AotKernel.tensor(cute.recast_ptr(base, dtype=Uint32), stages * p.block_m * p.tile_k // 2)
        w_base = base + stages * (p.ring_rows * p.tile_k * 2)
        s_w = AotKernel.vectors(w_base, 16, stages * tn * qw)
        s_wv = AotKernel.vectors(cute.recast_ptr(w_base, dtype=Uint32), 2, stages * tn * qw * 2)
        if not p.lane_pieces:
            s_wv = AotKernel.vectors(cute.recast_ptr(w_base, dtype=Uint32), 4, stages * tn * qw)
        return s_a32, s_a, s_w, s_wv

    def slab_views(self, smem):
        """Past the rings: the ring's mbarriers (bulk weight copies, or copy warps; past the
        scale slab), and the scale slab as 16-byte vectors, 16-bit words and elements."""
        p = self.p
        tn, srow, elem = p.tile_n, p.scale_row, self.element
        s_base = smem + p.split_k * p.part_ring_bytes
        mbars = cute.recast_ptr(s_base + tn * srow * 2, dtype=Int64)
        s_s = AotKernel.vectors(cute.recast_ptr(s_base, dtype=elem), 8, tn * srow // 8)
        s_s16 = AotKernel.tensor(cute.recast_ptr(s_base, dtype=Uint16), tn * srow)
        s_se = AotKernel.tensor(cute.recast_ptr(s_base, dtype=elem), tn * srow)
        return mbars, s_s, s_s16, s_se

    def global_views(self, a, w, scales, num_tokens: Int32):
        """The activations (16-byte pieces), the weights and the scales (16-byte units) in
        global memory, with the copy atoms of the activations and the scales."""
        p = self.p
        pieces = cutlass.max(num_tokens, Int32(1)) * (p.k // 8)  # 16-byte pieces of a
        g_a = AotKernel.vectors(cute.recast_ptr(a, dtype=Uint32), 4, pieces)
        atom_a = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
            Uint32,
            num_bits_per_copy=128,
        )
        g_w = AotKernel.vectors(w, 16, p.e_cap * p.n * (p.k // 32))
        g_s = AotKernel.vectors(scales, 8, p.e_cap * p.n * p.scale_chunks)
        atom_s = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
            self.element,
            num_bits_per_copy=128,
        )
        return g_a, atom_a, g_w, g_s, atom_s

    @cute.jit
    def prologue(
        self,
        k0: Int32,
        feeds,
        reach: Int32,
        row_routes,
        slab,
        mbars,
        part: Int32,
        tid_all: Int32,
        tid: Int32,
        ahead: cutlass.Constexpr[int],
    ):
        """Without copy warps: this thread's activation sources, the staged rows (interleaved
        ``nk`` tiles) and the part's slot mbarriers (bulk weights), then the scale slab and the
        first ``ahead`` k-tiles of the part from k-tile ``k0``. ``feeds``: the copies' views
        (``atom_a, g_a, s_a, g_w, s_w, w_src``); returns ``(a_src, staged, mbar)``, the rest of
        :meth:`~._copies.TileCopies.issue`'s arguments (None where the tile has none)."""
        p = self.p
        atom_a, g_a, s_a, g_w, s_w, w_src = feeds
        # This thread's activation rows: gathered token offsets, and whether to load them.
        a_src = self.copies.activation_sources(tid, reach, row_routes)
        staged = None  # interleaved nk tiles' next activation pieces
        if cutlass.const_expr(p.interleave and not p.atoms):
            staged = cute.make_rmem_tensor((4, p.copy_passes), Uint32)
            self.copies.stage_rows(k0, staged, g_a, a_src)

        mbar = None  # this part's slot mbarriers, where weights arrive by bulk copies
        if cutlass.const_expr(p.bulk):
            if tid_all == 0:
                for b in cutlass.range_constexpr(p.split_k * p.stages):
                    cute.arch.mbarrier_init(mbars + b, 1)  # the producer's arrive, plus the bytes
                cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()
            mbar = mbars + part * p.stages

        # The block's scale slab, once, by every thread, in the same commit group as k-tile 0.
        self.copies.copy_slab(slab, tid_all, p.cta_threads)
        for s in cutlass.range_constexpr(ahead):
            self.copies.issue(k0 + s, Int32(s), atom_a, g_a, s_a, a_src, staged, g_w, s_w, w_src, mbar, tid)
            cute.arch.cp_async_commit_group()
        if cutlass.const_expr(p.split_k > 1):
            # The k-loop syncs parts alone: the slab that every part reads must land first.
            cute.arch.cp_async_wait_group(p.stages - 2)
            cute.arch.sync_threads()
        return a_src, staged, mbar

    @cute.jit
    def split_roles(
        self,
        tile,
        row_routes,
        base,
        s_wv,
        s_s16,
        full,
        copies,
        slab,
        num_tokens,
        tid,
        wgmma: cutlass.Constexpr[bool],
    ):
        """``copy_warps``: the warps past the ``cta_threads`` compute threads issue every copy
        (:meth:`~._copies.TileCopies.produce`), the compute warpgroups only wait, dequantize,
        issue ``wgmma`` and store. No CTA barrier per k-tile: ring slot ``s`` changes hands on
        two mbarriers past the scale slab, ``full[s]`` (each copying thread arrives once its
        copies into the slot landed) and ``empty[s] = full[stages + s]`` (each compute thread
        arrives once the wgmmas that read the slot, and its own weight loads from it, are
        done). The compute warps run the same wgmmas in the same order as without copy warps:
        the same bits. ``full``: the mbarriers past the scale slab."""
        p = self.p
        if cutlass.const_expr(not wgmma):
            raise ValueError("copy_warps > 0 needs a wgmma tile (sm_90a, see W4A16Params.wgmma_fits)")
        stages = p.stages
        if tid == 0:
            for s in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_init(full + s, p.copiers)
                cute.arch.mbarrier_init(full + stages + s, p.cta_threads)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        # One CTA per SM: the copy warpgroup hands all but COPY_REGISTERS of its registers per
        # thread to the compute warpgroups (setmaxnreg), which need more than an even share.
        if tid >= p.cta_threads:
            cute.arch.setmaxregister_decrease(COPY_REGISTERS)
            self.copies.produce(tile.reach, row_routes, copies, slab, full, tid - p.cta_threads)
        else:
            cute.arch.setmaxregister_increase(p.compute_registers)
            mask = nibble_mask(num_tokens)
            self.wgmma.run(tile, base, s_wv, s_s16, copies, tid, mask, pipe=full)
