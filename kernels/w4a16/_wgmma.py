"""``moe.w4a16`` mainloop on sm_90a warpgroup MMAs (``wgmma.mma_async``, A from registers).

The roles swap: dequantized weights are the register A operand (64 rows per warpgroup and m64
chunk), the block's gathered activation rows the shared-memory B operand, which the copies
already store K-major with the 128-byte swizzle ``wgmma`` reads. A warpgroup of several m64
chunks dequantizes one chunk while the tensor cores run the one before, and with a ring of 4
or more stages across k-tiles too (see :meth:`WgmmaMainloop.kloop_wgmma`). Warpgroups of one
CTA share each activation tile (a 256-wide tile: two of two chunks). Blocks of more than
64 rows amortize each dequantized weight over more tokens. An expert's last block is often
mostly padding: its k-loop issues wgmmas only as wide as its real rows need (the narrowest of
``block_m`` and :data:`FITTING_WIDTHS`); with ``tail_rows``, a block that takes the next
block's few rows along issues them ``block_m + tail_rows`` wide. The epilogue stages the
output tile in the idle ring (tiles whose ring cannot hold it take the ``mma.sync`` loop), so
rows leave in whole 16-byte vectors. With copy warps the compute warpgroups never copy: they
take each k-tile's slot on an mbarrier and dequantize a chunk up to its scaling while the
chunk's previous wgmmas still run (:meth:`WgmmaMainloop.ktile_pipelined`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from b12x_aot.contract import cdiv

from .._base import AotKernel, dsl_dtype
from .._ptx import pack_b64, wgmma_rs
from ._copies import TileCopies
from ._dequant import int4_lane_pair, int4_pair, pair_selector, scale_pair, scaled
from ._layout import RingLayout
from ._params import W4A16Params

__all__ = ["KLoop", "WgmmaMainloop"]

# The narrower wgmma widths (multiples of 8) a block's k-loop may take, widest first: each is one
# more copy of the k-loop, so a few steps, finer where blocks often end.
FITTING_WIDTHS = (96, 64, 32, 16)

# A K-major shared-memory matrix descriptor with the 128-byte swizzle, as two 32-bit words: the
# low word holds the start address >> 4 (bits 0-13) and a leading byte offset of 1 (bits 16-29),
# the high word 1024 bytes between 8-row groups (>> 4) and the swizzle mode. A k-step's
# descriptor is then a per-thread low word plus a constant (kernels/_ptx.pack_b64).
DESC_LO_LBO = 1 << 16
DESC_HI = (1 << 30) | (1024 >> 4)


class KLoop(NamedTuple):
    """What every k-tile of the wgmma loop reads: the activation ring's descriptor low word
    (see :data:`DESC_HI`), the weight words and the scale slab in shared memory, the copies
    (:meth:`~._copies.TileCopies.issue`'s arguments; without copy warps), the ring's ``full`` then
    ``empty`` mbarriers (with copy warps, else None), the thread, its lane's byte selector and
    the dequant's nibble mask register."""

    desc_lo: Uint32
    s_wv: Any
    s_s16: Any
    copies: Any
    pipe: Any
    tid: Int32
    sel: Uint32
    mask: Uint32


def _wgmma_into(acc, ci: int, frag, desc: Int64, *, n: int, ab: str) -> None:
    """One wgmma on the first ``n // 2`` accumulators of chunk ``ci``, in place.

    A plain function, so its loops unroll at trace time without the DSL's loop rewriting.
    """
    out = wgmma_rs([acc[i, ci] for i in range(n // 2)], frag, desc, n=n, ab=ab)
    for i, value in enumerate(out):
        acc[i, ci] = value


class WgmmaMainloop:
    """The sm_90a ``wgmma`` k-loop and its epilogue, for a variant's ``params`` that fit it
    (:attr:`~._params.W4A16Params.wgmma_fits`): its k-tiles' copies are ``copies``' (without
    copy warps), its weight loads read ring slots laid out as ``ring`` says."""

    def __init__(self, params: W4A16Params, ring: RingLayout, copies: TileCopies) -> None:
        self.p, self.ring, self.copies = params, ring, copies
        self.output = dsl_dtype(params.output)

    def tiles_ahead(self) -> int:
        """k-tiles in flight ahead of the one computing: the ring's other slots, but one fewer
        where a k-tile's wgmmas run across the next k-tile's barrier (:meth:`overlaps_ktiles`):
        the slot it refills is then two k-tiles old."""
        return self.p.stages - 2 if self.overlaps_ktiles() else self.p.stages - 1

    def overlaps_ktiles(self) -> bool:
        """Whether the loop keeps a k-tile's last chunks running across the next k-tile's
        barrier: a warpgroup of several m64 chunks, and a ring deep enough that this still
        leaves two k-tiles in flight."""
        return self.wg_chunks() > 1 and self.p.stages >= 4

    @cute.jit
    def run(self, tile, base, s_wv, s_s16, copies, tid: Int32, mask: Uint32, pipe=None):
        """k-loop of ``wgmma`` m64 x (up to ``block_m + tail_rows``) x k16 and the epilogue
        (sm_90a, 64-wide k-tiles).

        Warpgroup ``wg`` owns the m64 chunks ``wg, wg + WG, ...`` of the tile's weight rows; in
        each, warp ``v`` holds rows ``16v + g`` and ``16v + g + 8``. A k16 step's A fragment is
        k ``16s + 2c``, ``+ 1``, ``+ 8``, ``+ 9`` of those rows (byte ``c`` of words ``2s`` and
        ``2s + 1`` of an ``nk`` row's 32-byte chunk; the lane's own 8 bytes in ``n64k128``),
        dequantized like the ``mma.sync`` path's B operand; B is the activation tile, K-major
        with the 128-byte swizzle the copies already apply. A chunk's accumulators receive the
        same wgmmas in the same order whatever the CTA size, so ``cta_threads`` never changes a
        result bit. ``tile``: an :class:`~._tile.OutTile`; past ``block_m`` rows of
        reach, the wgmmas take ``block_m + tail_rows`` rows. ``mask``: the dequant's nibble
        mask register (:func:`~._dequant.nibble_mask`). ``pipe``: with copy warps, the
        ring's ``full`` mbarriers, then its ``empty`` ones (:meth:`~._block.BlockGemm.split_roles`);
        ``copies`` is then unused.
        """
        p = self.p
        bm = p.block_m
        c = tid % 4
        sel = Uint32(pair_selector(c))
        acc = cute.make_rmem_tensor((p.ring_rows // 2, self.wg_chunks()), Float32)
        acc.fill(0.0)
        # The low word of the activation ring's descriptor (see DESC_HI), held once.
        desc_lo = (Uint32(base.toint()) >> 4) | Uint32(DESC_LO_LBO)
        state = KLoop(desc_lo, s_wv, s_s16, copies, pipe, tid, sel, mask)
        # Padding rows sit at a block's tail (an expert's last block): the wgmmas cover the
        # narrowest width that holds every real row, so a block of a few real rows costs its
        # dequant but only an n = 16 wgmma per step.
        widths = (bm, *(x for x in FITTING_WIDTHS if x < bm))
        if cutlass.const_expr(p.tail_rows > 0):
            if tile.reach > bm:
                self.kloop_wgmma(acc, state, n=p.ring_rows)
            else:
                self.kloop_fitting(acc, state, tile, widths)
        else:
            self.kloop_fitting(acc, state, tile, widths)
        self.store_staged(tile, acc, base, tid)

    @cute.jit
    def store_staged(self, tile, acc, base, tid: Int32):
        """Epilogue through shared memory: the rounded accumulators into a row-major
        ``(block_m + tail_rows) x tile_n`` tile in the idle ring, then each real row of the
        ``reach`` this CTA computed out in whole 16-byte vectors, a warp covering contiguous row
        segments, instead of one scattered 2- or 4-byte store per element. Accumulator ``4i + 2rr + e`` of chunk ``ci`` is (weight row
        ``r0 + 8rr``, block row ``8i + 2c + e``). Rows are 16 B longer than the tile, so the
        accumulator stores of a warp (rows ``2c + e``, columns ``g``) hit distinct banks.

        The routes of the thread's output rows are read first, all at once: read between the
        output stores (which ptxas must assume may write scratch), each would wait for a round
        trip of its own."""
        p = self.p
        m_out, sc, rows, reach, nt = tile
        mt, tn, vec = p.ring_rows, p.tile_n, p.out_vec
        wgs, chunks, wg, v, g = self.warpgroup_coords(tid)
        c = tid % 4
        stride = tn + vec  # elements per staged row
        per_row = tn // vec
        passes = cdiv(mt * per_row, p.part_threads)
        routes = cute.make_rmem_tensor((passes,), Int32)  # -1: nothing to store
        for j in cutlass.range_constexpr(passes):
            r = (tid + j * p.part_threads) // per_row
            routes[j] = -1
            if r < reach:
                routes[j] = sc[rows + r]
        s_o = AotKernel.tensor(cute.recast_ptr(base, dtype=self.output), mt * stride)
        s_ov = AotKernel.vectors(cute.recast_ptr(base, dtype=self.output), vec, mt * stride // vec)
        self.compute_sync()  # every warp's wgmmas, the ring's last readers, are done
        for ci in cutlass.range_constexpr(chunks):
            col = (wg + ci * wgs) * 64 + v * 16 + g
            for i in cutlass.range_constexpr(mt // 8):
                for e in cutlass.range_constexpr(2):
                    for rr in cutlass.range_constexpr(2):
                        s_o[(8 * i + 2 * c + e) * stride + col + 8 * rr] = acc[4 * i + 2 * rr + e, ci].to(
                            self.output
                        )
        self.compute_sync()
        piece = cute.make_rmem_tensor((vec,), self.output)
        for j in cutlass.range_constexpr(passes):
            r, q = (tid + j * p.part_threads) // per_row, (tid + j * p.part_threads) % per_row
            if routes[j] >= 0:
                cute.autovec_copy(s_ov[None, r * (stride // vec) + q], piece)
                cute.autovec_copy(piece, m_out[None, routes[j] * (p.n // vec) + nt * per_row + q])

    @cute.jit
    def compute_sync(self):
        """A barrier of the compute threads: the CTA's, or with copy warps (done copying by
        the epilogue) named barrier 1 of ``cta_threads``."""
        p = self.p
        if cutlass.const_expr(p.copy_warps):
            cute.arch.barrier(barrier_id=1, number_of_threads=p.cta_threads)
        else:
            cute.arch.sync_threads()

    def wg_chunks(self) -> int:
        """m64 chunks of the tile's weight rows per warpgroup."""
        p = self.p
        return p.tile_n // 64 // (p.part_threads // 128)

    def warpgroup_coords(self, tid: Int32):
        """Warpgroups per CTA, m64 chunks per warpgroup, and this thread's warpgroup ``wg``, warp
        ``v`` in it and MMA row group ``g`` (lane // 4)."""
        p = self.p
        return p.part_threads // 128, self.wg_chunks(), tid // 128, (tid // 32) % 4, tid % 32 // 4

    @cute.jit
    def kloop_fitting(self, acc, state, tile, widths: cutlass.Constexpr[tuple]):
        """The k-loop of the narrowest of ``widths`` (widest first) that holds every real row of
        the block: real rows come first, so row ``w`` is real iff more than ``w`` rows are.
        Nested branches, not a sequence of ifs: ptxas then sees exactly one k-loop per path."""
        if cutlass.const_expr(len(widths) == 1):
            self.kloop_wgmma(acc, state, n=widths[0])
        else:
            if tile.sc[tile.rows + widths[1]] >= 0:
                self.kloop_wgmma(acc, state, n=widths[0])
            else:
                self.kloop_fitting(acc, state, tile, widths[1:])

    @cute.jit
    def kloop_wgmma(self, acc, state, n: cutlass.Constexpr[int]):
        """The k-loop: wgmmas of ``n`` block rows (the first ``n // 2`` accumulators per chunk).

        One wgmma group per chunk and k-tile. A chunk's A fragments, the same PTX registers in
        every k-tile, may be rewritten only once the group that read them is done: before each
        chunk, at most ``chunks - 1`` groups may still run. When :meth:`overlaps_ktiles`, that
        holds across the k-tile barrier too, as the slot refilled there held ``kt - 2``;
        otherwise every group is done at the barrier (the slot refilled held ``kt - 1``), and a
        warpgroup of one chunk dequantizes while other warpgroups' wgmmas run. With copy
        warps (``pipe``), no CTA barrier: :meth:`ktile_pipelined`.
        """
        p = self.p
        reuse = self.wg_chunks() - 1
        if cutlass.const_expr(state.pipe is None):
            top = reuse if self.overlaps_ktiles() else 0
            for kt in range(p.part_ktiles):
                self.ktile_wgmma(acc, state, kt, n, top, reuse)
        else:
            for kt in range(p.part_ktiles):
                self.ktile_pipelined(acc, state, kt, n, reuse)
        cute.nvgpu.warpgroup.wait_group(0)

    @cute.jit
    def wait_full(self, pipe, kt: Int32):
        """Wait until k-tile ``kt``'s copies are in its ring slot (copy warps)."""
        p = self.p
        cute.arch.mbarrier_wait(pipe + kt % p.stages, (kt // p.stages) % 2)
        # The copies were generic-proxy writes; the wgmmas read through the async proxy.
        cute.arch.fence_proxy("async.shared", space="cta")

    @cute.jit
    def ktile_wgmma(
        self,
        acc,
        state,
        kt: Int32,
        n: cutlass.Constexpr[int],
        top: cutlass.Constexpr[int],
        reuse: cutlass.Constexpr[int],
    ):
        """One k-tile without copy warps: wait (at most ``top`` groups left running), barrier,
        refill, then per chunk: wait (at most ``reuse``), dequantize, fence and issue its four
        wgmmas as one group."""
        p = self.p
        copies, tid, stages = state.copies, state.tid, p.stages
        ahead = self.tiles_ahead()
        cute.arch.cp_async_wait_group(ahead - 1)  # this thread's copies of k-tile kt landed
        # Groups still running are k-tile kt - 1's: the slot refilled next is not theirs. The
        # barrier makes every thread's copies of kt visible and every warp's wait count.
        cute.nvgpu.warpgroup.wait_group(top)
        cute.arch.sync_threads()
        nxt = kt + ahead
        if nxt < p.part_ktiles:
            self.copies.issue(nxt, nxt % stages, *copies, tid, rows=n)  # rows past n: padding
        cute.arch.cp_async_commit_group()
        slot = kt % stages
        for ci in cutlass.range_constexpr(self.wg_chunks()):
            if cutlass.const_expr(ci > 0):
                # Frees this chunk's A registers. Without a wait here ptxas would also see A
                # registers defined inside a pipeline stage, and serialize every wgmma.
                cute.nvgpu.warpgroup.wait_group(reuse)
            self.issue_chunk(acc, state, ci, slot, self.chunk_operands(state, kt, slot, ci), n)

    @cute.jit
    def ktile_pipelined(
        self, acc, state, kt: Int32, n: cutlass.Constexpr[int], reuse: cutlass.Constexpr[int]
    ):
        """One k-tile with copy warps: wait for its slot's ``full`` barrier, then per chunk:
        dequantize up to the scaling (under the wgmmas still in flight), wait (at most
        ``reuse`` groups left running), scale, fence and issue its four wgmmas as one group.
        Once k-tile ``kt - 1``'s groups are done (the wait before the last chunk), each thread
        releases that slot on its ``empty`` barrier."""
        p = self.p
        pipe, stages, chunks = state.pipe, p.stages, self.wg_chunks()
        slot = kt % stages
        self.wait_full(pipe, kt)
        for ci in cutlass.range_constexpr(chunks):
            ops = self.chunk_operands(state, kt, slot, ci)
            cute.nvgpu.warpgroup.wait_group(reuse)  # frees this chunk's A registers
            if cutlass.const_expr(ci == chunks - 1):  # noqa: SIM102 (a trace-time test, then a traced one)
                # k-tile kt - 1's wgmmas are done, and so are this thread's loads from its
                # slot. Inline: behind a helper's branch ptxas serialized the wgmmas.
                if kt > 0:
                    cute.arch.mbarrier_arrive(pipe + stages + (kt + stages - 1) % stages)
            self.issue_chunk(acc, state, ci, slot, ops, n)

    @cute.jit
    def chunk_operands(self, state, kt: Int32, slot: Int32, ci: cutlass.Constexpr[int]):
        """Chunk ``ci``'s A operands of k-tile ``kt`` (in ring slot ``slot``) up to the scaling
        multiply: per k16 step, ``(q, scale pair)`` for each of its four A registers. Reads only
        the slot and defines no A register, so it may run under wgmmas that read them.

        A k16 step's A fragment is k ``16s + 2c``, ``+ 1``, ``+ 8``, ``+ 9`` of the chunk's rows
        (byte ``c`` of words ``2s`` and ``2s + 1`` of an ``nk`` row's 32-byte chunk; the lane's
        own 8 bytes in ``n64k128``), dequantized like the ``mma.sync`` path's B operand."""
        p = self.p
        s_wv, s_s16, tid, sel, mask = state.s_wv, state.s_s16, state.tid, state.sel, state.mask
        c = tid % 4
        wgs, _, wg, v, g = self.warpgroup_coords(tid)
        r0 = (wg + ci * wgs) * 64 + v * 16 + g
        if cutlass.const_expr(p.atoms):
            # n64k128: this lane's 8 bytes of each row hold its k's (lane order).
            wv = cute.make_rmem_tensor((2, 2), Uint32)  # word, row (r0, r0 + 8)
            for rr in cutlass.range_constexpr(2):
                cute.autovec_copy(
                    s_wv[None, self.ring.w_lane_piece(slot, 0, r0 + 8 * rr, g, c)], wv[None, rr]
                )
        else:
            wv = cute.make_rmem_tensor((4, 2, 2), Uint32)  # word, 16-byte half, row (r0, r0 + 8)
            for rr in cutlass.range_constexpr(2):
                for h in cutlass.range_constexpr(2):
                    unit = slot * (p.tile_n * p.w_chunks) + (r0 + 8 * rr) * 2 + (h ^ (g // 4))
                    cute.autovec_copy(s_wv[None, unit], wv[None, h, rr])
        sp2 = cute.make_rmem_tensor((2,), Uint32)
        ops = []
        for s in cutlass.range_constexpr(4):
            if cutlass.const_expr(16 * s % min(p.group, 64) == 0):
                grp = (kt * 64 + 16 * s) // p.group
                for rr in cutlass.range_constexpr(2):
                    sv = Uint32(s_s16[(r0 + 8 * rr) * p.scale_row + grp])
                    sp2[rr] = scale_pair(sv)
            pairs = []
            for e, rr in ((0, 0), (0, 1), (1, 0), (1, 1)):
                if cutlass.const_expr(p.atoms):
                    q = int4_lane_pair(wv[0, rr], wv[1, rr], s, e, p.element, mask)
                else:
                    q = int4_pair(wv[2 * (s % 2) + e, s // 2, rr], sel, p.element, mask)
                pairs.append((q, sp2[rr]))
            ops.append(pairs)
        return ops

    @cute.jit
    def issue_chunk(
        self, acc, state, ci: cutlass.Constexpr[int], slot: Int32, ops, n: cutlass.Constexpr[int]
    ):
        """Scale chunk ``ci``'s operands (:meth:`chunk_operands`) into its A registers, fence, and
        issue its four wgmmas of ``n`` block rows on ring slot ``slot`` as one group."""
        p = self.p
        desc_lo = state.desc_lo
        ab = "bf16" if p.element == "bf16" else "f16"
        frags = [tuple(scaled(q, sp, p.element) for q, sp in pairs) for pairs in ops]
        # One fence for the chunk's four A fragments: the wgmmas after it chain on the same
        # accumulators, which needs no fence between them.
        cute.nvgpu.warpgroup.fence()
        for s in cutlass.range_constexpr(4):
            lo = desc_lo + Uint32(slot * (p.ring_rows * 8) + 2 * s)  # + (slot * mt * 128 + 32 s) >> 4
            _wgmma_into(acc, ci, frags[s], pack_b64(lo, Uint32(DESC_HI)), n=n, ab=ab)
        cute.nvgpu.warpgroup.commit_group()
