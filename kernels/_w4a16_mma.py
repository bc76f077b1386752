"""``moe.w4a16`` mainloops on warp-level ``mma.sync`` m16n8k16 (every arch).

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
  order (:mod:`b12x_aot.loader.w4a16_layout`): the lane's 8 bytes hold its k's of the natural
  MMA slots as (k, k + 1) pairs, still one shift each, the activation words need no pairing
  (each goes unchanged to its lane's place by a 4-byte ``cp.async``, in the k-tile's commit
  group, with the weights unless those arrive by bulk copies), and the MMA roles swap (:meth:`MmaSyncMainloop.compute_swapped`; a warp must hold
  whole m16 atoms of weight rows, ``tile_n / warps`` a multiple of 16): dequantized weights
  are A, the block's tokens B, and a block of at most 8 real rows (most decode blocks)
  takes one n8 token atom, half the MMAs; each output element still sums the same products in
  the same MMA k-slots as the untransposed loop did (the same bits on an H200). When
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

from ._ptx import ldmatrix_x4, prmt, st_cluster_f32
from ._w4a16_dequant import int4_lane_pair, int4_pair, int4_split_pair, pair_selector, scale_pair, scaled

__all__ = ["MmaSyncMainloop"]


def _unravel(e: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The column-major coordinate of flat index ``e`` in ``shape``."""
    coord = []
    for extent in shape:
        coord.append(e % extent)
        e //= extent
    return tuple(coord)


class MmaSyncMainloop:
    """Mixin of :class:`~.w4a16.W4A16`: the ``mma.sync`` k-loop, its operands and epilogue."""

    @cute.jit
    def mainloop_mma(self, tile, views, copies, where):
        """k-loop of warp-level ``mma.sync`` and the epilogue of ``tile`` (an
        :class:`~._w4a16_tile.OutTile`; every arch, every tile the wgmma loop does not take). ``where``: this thread's index in its k-part, the part, the
        CTA's rank in its cluster, the part's first k-tile, and the start of shared memory (for
        the parts' and CTAs' sums). ``views`` ends with the dequant's nibble mask register
        (:func:`~._w4a16_dequant.nibble_mask`)."""
        a_row0, s_a32, s_wv, s_s16, s_se, mma, mask = views
        tid, part, rank, k0, smem = where
        lane, warp = tid % 32, tid // 32
        g, c = lane // 4, lane % 4
        sel = Uint32(pair_selector(c))  # this lane's byte of each weight word
        shape = self.acc_shape
        acc = cute.make_rmem_tensor(shape, Float32)
        acc.fill(0.0)
        state = (a_row0, s_a32, s_wv, s_s16, s_se, mma, copies, tid, part, k0, warp, g, c, sel, mask)
        if cutlass.const_expr(self.swapped):
            # Tokens are the n8 operand: a block of at most 8 real rows needs one n8 atom (real
            # rows come first in a block, see route_pack).
            if tile.sc[tile.rows + 8] >= 0:
                self.kloop_mma(acc, state, 2)
            else:
                self.kloop_mma(acc, state, 1)
        else:
            self.kloop_mma(acc, state, 0)  # no token atoms: tokens are the m16 operand
        if cutlass.const_expr(self.split > 1):
            self.add_parts(acc, shape, part, tid, smem)
        if cutlass.const_expr(self.k_ctas > 1):
            self.add_ctas(acc, shape, part, rank, tid, smem)
        if part == 0 and rank == 0:
            if cutlass.const_expr(self.swapped):
                self.store_swapped(tile, acc, warp, g, c)
            else:
                self.store_mma(tile, acc, warp, g, c)

    @cute.jit
    def kloop_mma(self, acc, state, ntok: cutlass.Constexpr[int]):
        """The k-loop; ``ntok``: n8 token atoms of a swapped decode tile (0 for the others)."""
        a_row0, s_a32, s_wv, s_s16, s_se, mma, copies, tid, part, k0, warp, g, c, sel, mask = state
        stages = self.stages
        mbar = copies[-1]  # issue()'s last copy argument: the part's slot mbarriers (bulk weights)
        for i in range(self.kt_count):
            cute.arch.cp_async_wait_group(stages - 2)
            self.part_sync(part)
            nxt = i + stages - 1
            if nxt < self.kt_count:
                self.issue(k0 + nxt, nxt % stages, *copies, tid)
            cute.arch.cp_async_commit_group()
            if cutlass.const_expr(self.bulk):  # k-tile i's weights: on its slot's mbarrier
                cute.arch.mbarrier_wait(mbar + i % stages, (i // stages) % 2)
            if cutlass.const_expr(self.swapped):
                self.compute_swapped(
                    k0 + i, i % stages, acc, s_a32, s_wv, (s_s16, s_se), mma, warp, g, c, mask, ntok
                )
            elif cutlass.const_expr(self.interleave):
                self.compute_interleaved(
                    k0 + i, i % stages, acc, s_a32, s_wv, (s_s16, s_se), mma, warp, g, c, mask
                )
            else:
                self.compute_rows(k0 + i, i % stages, acc, a_row0, s_wv, s_s16, mma, warp, g, c, sel, mask)

    @cute.jit
    def part_sync(self, part: Int32):
        """Barrier of one k-part's threads (the whole CTA when there is one part)."""
        if cutlass.const_expr(self.split == 1):
            cute.arch.sync_threads()
        else:
            cute.arch.barrier(barrier_id=part + 1, number_of_threads=self.threads)

    def sum_word(self, shape: tuple, first: int, i, e: int, tid):
        """Word ``e`` of stored sum ``i`` (a k-part's or a CTA's, counted from 0) past word
        ``first`` of the sums area: each sum is ``count * threads`` words, lanes consecutive, so
        a thread's accumulators meet the same thread's of every other part or CTA."""
        return first + (i * (shape[0] * shape[1] * shape[2]) + e) * self.threads + tid

    @cute.jit
    def add_sums(self, acc, shape: cutlass.Constexpr[tuple], smem, first: int, total: int, tid: Int32):
        """``acc`` (of ``shape``) += stored sums ``0 .. total - 1`` past word ``first`` of
        ``smem``, in that order."""
        count = shape[0] * shape[1] * shape[2]
        sums = self.tensor(cute.recast_ptr(smem, dtype=Float32), first + total * count * self.threads)
        for i in cutlass.range_constexpr(total):
            for e in cutlass.range_constexpr(count):
                at = _unravel(e, shape)
                acc[at] = acc[at] + sums[self.sum_word(shape, first, i, e, tid)]

    @cute.jit
    def add_parts(self, acc, shape: cutlass.Constexpr[tuple], part: Int32, tid: Int32, smem):
        """Part 0's accumulators (of ``shape``) += part 1's, part 2's, ..., in that order, through
        shared memory (the drained rings)."""
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        count = shape[0] * shape[1] * shape[2]
        sums = self.tensor(cute.recast_ptr(smem, dtype=Float32), (self.split - 1) * count * self.threads)
        if part > 0:
            for e in cutlass.range_constexpr(count):
                sums[self.sum_word(shape, 0, part - 1, e, tid)] = acc[_unravel(e, shape)]
        cute.arch.sync_threads()
        if part == 0:
            self.add_sums(acc, shape, smem, 0, self.split - 1, tid)

    @cute.jit
    def add_ctas(self, acc, shape: cutlass.Constexpr[tuple], part: Int32, rank: Int32, tid: Int32, smem):
        """Rank 0's part-0 accumulators (of ``shape``) += rank 1's, rank 2's, ..., in that order
        (each CTA's parts already added): the others store theirs into rank 0's drained ring,
        past the parts' sums, between two cluster barriers."""
        cute.arch.cp_async_wait_group(0)
        cute.arch.cluster_arrive()  # every CTA of the cluster is past its k-loop: rings are free
        cute.arch.cluster_wait()
        count = shape[0] * shape[1] * shape[2]
        first = (self.split - 1) * count * self.threads  # word past the parts' sums
        if part == 0 and rank > 0:
            at = smem.toint() + self.sum_word(shape, first, rank - 1, 0, tid) * 4  # word 0; e follows
            for e in cutlass.range_constexpr(count):
                st_cluster_f32(at + e * self.threads * 4, Int32(0), acc[_unravel(e, shape)])
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        if part == 0 and rank == 0:
            self.add_sums(acc, shape, smem, first, self.k_ctas - 1, tid)

    @cute.jit
    def store_mma(self, tile, acc, warp: Int32, g: Int32, c: Int32):
        """The epilogue: round once, store the two adjacent columns of each row this lane holds.
        The rows' routes are read first, at once (why: ``WgmmaMainloop.store_staged``)."""
        m_out, sc, rows, _, nt = tile
        tn = self.tn
        half = self.vectors(m_out.iterator, 2, cute.size(m_out) // 2)
        y = cute.make_rmem_tensor((2,), self.output)
        routes = cute.make_rmem_tensor((self.ma, 2), Int32)
        for mi in cutlass.range_constexpr(self.ma):
            for h in cutlass.range_constexpr(2):
                routes[mi, h] = sc[rows + mi * 16 + h * 8 + g]
        for mi in cutlass.range_constexpr(self.ma):
            for h in cutlass.range_constexpr(2):
                route = routes[mi, h]
                if route >= 0:
                    for at in cutlass.range_constexpr(self.na):
                        col = nt * tn + warp * self.nw + at * 8 + 2 * c
                        y[0] = acc[2 * h, mi, at].to(self.output)
                        y[1] = acc[2 * h + 1, mi, at].to(self.output)
                        cute.autovec_copy(y, half[None, (route * self.n + col) // 2])

    @cute.jit
    def stage_rows(self, kt: Int32, staged, g_a, a_src):
        """Load this thread's 16-byte pieces of k-tile ``kt``'s activation rows into ``staged``
        (interleaved ``nk`` tiles: :meth:`pair_rows` stores them one k-tile later, so in the
        k-loop the load's latency hides behind a k-tile of MMAs; the prologue waits for its
        two)."""
        for i in cutlass.range_constexpr(self.ra):
            if a_src[i] >= 0:
                cute.autovec_copy(g_a[None, a_src[i] + kt * self.qa], staged[None, i])

    @cute.jit
    def pair_rows(self, slot: Int32, staged, s_a, a_src, tid: Int32):
        """Store the staged activation pieces into ring slot ``slot``, interleaved, in the k
        order of the ``nk`` weights (see :meth:`compute_interleaved`).

        Piece ``q`` of row ``r`` is k ``[8q, 8q + 8)``, words ``x0..x3``; its operand words are
        ``(k + s, k + s + 4)`` for ``s < 4``, one ``prmt`` each, stored where :meth:`a_word`
        says. (``n64k128`` tiles need no pairing: ``issue`` copies each word straight to
        :meth:`a_lane_word`.)
        """
        for i in cutlass.range_constexpr(self.ra):
            r, q = self.a_piece(tid, i)
            if a_src[i] >= 0:
                for s in cutlass.range_constexpr(4):
                    word = prmt(staged[s // 2, i], staged[s // 2 + 2, i], 0x5410 if s % 2 == 0 else 0x7632)
                    s_a[self.a_word(slot, r, q, s)] = word

    def a_rows_at(self, slot, atom, g, per_unit: int = 1):
        """Where rows ``g`` and ``g + 8`` of m16 atom ``atom`` start in ring slot ``slot`` of the
        interleaved activation tile, in 16-byte units (or in ``1 / per_unit`` of them); their
        A-fragment units follow in the order :meth:`a_unit` gives."""
        units = self.tk // 4 * per_unit  # per (row g, row g + 8) pair
        return slot * (self.bm * units // 2) + atom * (8 * units) + g * units

    @staticmethod
    def a_unit(k16, step, g):
        """Where A-fragment unit ``(k16, step)`` of rows ``g``, ``g + 8`` sits after
        :meth:`a_rows_at`, in 16-byte units: ``4 * k16 + (step ^ ((k16 & 2) | (g & 1)))``, with
        ``k16 = k // 16`` in the k-tile. Row pairs start on 128-byte boundaries (``tile_k / 4``
        units), so a unit's bank group is its offset mod 8. An ``ld.shared.v4`` is served eight
        lanes at a time, ``g`` in ``{2i, 2i + 1}`` by ``c`` in ``0..3``, reading ``k16 = 4j + c``:
        ``c & 1`` picks half of the eight bank groups and the XOR spreads ``c & 2`` and ``g & 1``
        over its four, so the eight lanes hit every bank once."""
        return 4 * k16 + (((k16 & 2) | (g & 1)) ^ step)

    def a_word(self, slot, r, q, s):
        """Where :meth:`pair_rows` (``nk``), or through :meth:`a_lane_word` the ``n64k128`` copies,
        store step ``s`` of piece ``q`` of row ``r``, in 32-bit words:
        A-fragment unit ``(q // 2, s)`` of rows ``r % 8``, ``r % 8 + 8`` holds
        ``[g:0, g+8:0, g:1, g+8:1]`` (row, k-half ``q % 2``), one A fragment; on swapped tiles
        ``[g:0, g:1, g+8:0, g+8:1]``, the B fragments of token atoms 0 and 1, each a register
        pair as loaded (no moves before the MMA)."""
        g, atom, half = r % 8, (r % 16) // 8, q % 2
        within = atom * 2 + half if self.swapped else atom + half * 2
        return self.a_rows_at(slot, r // 16, g, per_unit=4) + within + self.a_unit(q // 2, s, g) * 4

    def a_lane_word(self, slot, r, q, lane: int):
        """Where the ``n64k128`` copies of ``issue`` put word ``lane`` of piece ``q`` of row
        ``r``, in 32-bit words. It holds k ``8q + 2 lane`` and ``+ 1``: lane
        ``lane``'s k-half ``q % 2`` of MMA step ``(q // 2) % 4`` in 64-wide chunk ``q // 8``
        (k ``64j + 16s + 8e + 2c``), so it goes where :meth:`a_word` puts that lane's piece of
        that step."""
        return self.a_word(slot, r, (q // 8) * 8 + 2 * lane + q % 2, (q // 2) % 4)

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
        tn, qa = self.tn, self.qa
        na, ma = self.na, self.ma
        for j in cutlass.range_constexpr(self.tk // 64):
            wv = cute.make_rmem_tensor((2 if self.atoms else 4, na), Uint32)
            sp2 = cute.make_rmem_tensor((na,), Uint32)
            for s in cutlass.range_constexpr(4):
                if cutlass.const_expr(self.atoms and s == 0):  # the lane's 8 bytes of each row
                    for at in cutlass.range_constexpr(na):
                        row = warp * self.nw + at * 8 + g
                        cute.autovec_copy(s_wv[None, self.w_lane_piece(slot, j, row, g, c)], wv[None, at])
                if cutlass.const_expr(not self.atoms and s % 2 == 0):  # the 16-byte half for s, s + 1
                    for at in cutlass.range_constexpr(na):
                        unit = (
                            slot * (tn * self.qw)
                            + j * (tn * 2)
                            + (warp * self.nw + at * 8 + g) * 2
                            + ((s // 2) ^ (g // 4))
                        )
                        cute.autovec_copy(s_wv[None, unit], wv[None, at])
                if cutlass.const_expr(16 * s % min(self.group, 64) == 0):
                    grp = (kt * self.tk + 64 * j + 16 * s) // self.group
                    for at in cutlass.range_constexpr(na):
                        v = Uint32(s_s16[(warp * self.nw + at * 8 + g) * self.srow + grp])
                        sp2[at] = scale_pair(v)
                afr = cute.make_rmem_tensor((4, ma), Uint32)
                for mi in cutlass.range_constexpr(ma):
                    x = ldmatrix_x4((a_row0 + (slot * self.mt + mi * 16) * (qa * 16) + j * 128) ^ (s << 5))
                    for i in cutlass.range_constexpr(4):
                        afr[i, mi] = x[i]
                bfr = cute.make_rmem_tensor((2, na), Uint32)
                for at in cutlass.range_constexpr(na):
                    for e in cutlass.range_constexpr(2):
                        if cutlass.const_expr(self.atoms):
                            q = int4_lane_pair(wv[0, at], wv[1, at], s, e, self.elem_name, mask)
                        else:
                            q = int4_pair(wv[2 * (s % 2) + e, at], sel, self.elem_name, mask)
                        bfr[e, at] = scaled(q, sp2[at], self.elem_name)
                self.mma_step(mma, acc, afr, bfr)

    def mma_step(self, mma, acc, afr, bfr, ma: int | None = None, na: int | None = None):
        """``acc += A x B`` for every (m16, n8) atom pair of this warp's fragments (``ma`` m16
        atoms of A and ``na`` n8 atoms of B, by default the warp's)."""
        ma, na = ma or self.ma, na or self.na
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
        identically for A (:meth:`pair_rows`) and B.
        """
        na, ma = self.na, self.ma
        s_s16, s_se = scale_views
        target = acc
        if cutlass.const_expr(self.fp32_scale):
            target = cute.make_rmem_tensor((4, ma, na), Float32)
            target.fill(0.0)
        for j in cutlass.range_constexpr(self.tk // 64):
            wq = cute.make_rmem_tensor((2, na), Uint32)
            sp2 = cute.make_rmem_tensor((na,), Uint32)
            for at in cutlass.range_constexpr(na):
                nl = warp * self.nw + at * 8 + g
                cute.autovec_copy(s_wv[None, self.w_lane_piece(slot, j, nl, g, c)], wq[None, at])
                if cutlass.const_expr(not self.fp32_scale):
                    # the group of the lane's 16 contiguous k's
                    v = Uint32(s_s16[nl * self.srow + (kt * self.tk + 64 * j + 16 * c) // self.group])
                    sp2[at] = scale_pair(v)
            for step in cutlass.range_constexpr(4):
                afr = cute.make_rmem_tensor((4, ma), Uint32)
                for mi in cutlass.range_constexpr(ma):
                    unit = self.a_rows_at(slot, mi, g) + self.a_unit(4 * j + c, step, g)
                    cute.autovec_copy(s_a32[None, unit], afr[None, mi])
                bfr = cute.make_rmem_tensor((2, na), Uint32)
                for at in cutlass.range_constexpr(na):
                    for e in cutlass.range_constexpr(2):
                        q = int4_split_pair(wq[e, at], step, self.elem_name, mask)
                        if cutlass.const_expr(self.fp32_scale):
                            bfr[e, at] = q  # exact int4; the k-tile's sum takes the scale in fp32
                        else:
                            bfr[e, at] = scaled(q, sp2[at], self.elem_name)
                self.mma_step(mma, target, afr, bfr)
        if cutlass.const_expr(self.fp32_scale):
            # The lane's accumulators are columns 2c and 2c + 1 of each atom: one scale each.
            grp = (kt * self.tk) // self.group
            for at in cutlass.range_constexpr(na):
                col = warp * self.nw + at * 8 + 2 * c
                s0 = s_se[col * self.srow + grp].to(Float32)
                s1 = s_se[(col + 1) * self.srow + grp].to(Float32)
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
        ``+ 8``, ``+ 9``); the interleaved activation unit of :meth:`a_lane_word` holds tokens
        ``g`` and ``g + 8`` at those k's, the B fragments of both n8 atoms.
        """
        mw = self.mw
        s_s16, s_se = scale_views
        fp32 = self.fp32_scale
        target = acc
        if cutlass.const_expr(fp32):
            target = cute.make_rmem_tensor((4, mw, 2), Float32)
            target.fill(0.0)
        for j in cutlass.range_constexpr(self.tk // 64):
            wq = cute.make_rmem_tensor((2, 2, mw), Uint32)  # word, row (g, g + 8), m16 atom
            sp2 = cute.make_rmem_tensor((2, mw), Uint32)
            for mi in cutlass.range_constexpr(mw):
                for rr in cutlass.range_constexpr(2):
                    # Written out here and below on purpose: the same sum returned by a helper
                    # method cost the split-k tile a register (129), half its occupancy at 256
                    # threads and 12 % at 1 token on an H200.
                    row = warp * self.nw + mi * 16 + rr * 8 + g
                    cute.autovec_copy(s_wv[None, self.w_lane_piece(slot, j, row, g, c)], wq[None, rr, mi])
            for step in cutlass.range_constexpr(4):
                if cutlass.const_expr(not fp32 and 16 * step % min(self.group, 64) == 0):
                    grp = (kt * self.tk + 64 * j + 16 * step) // self.group
                    for mi in cutlass.range_constexpr(mw):
                        for rr in cutlass.range_constexpr(2):
                            row = warp * self.nw + mi * 16 + rr * 8 + g
                            sp2[rr, mi] = scale_pair(Uint32(s_s16[row * self.srow + grp]))
                bfr = cute.make_rmem_tensor((2, 2), Uint32)  # [g:e0, g:e1, g+8:e0, g+8:e1]
                cute.autovec_copy(
                    s_a32[None, self.a_rows_at(slot, 0, g) + self.a_unit(4 * j + c, step, g)], bfr
                )
                afr = cute.make_rmem_tensor((4, mw), Uint32)
                for mi in cutlass.range_constexpr(mw):
                    for e in cutlass.range_constexpr(2):
                        for rr in cutlass.range_constexpr(2):
                            q = int4_lane_pair(wq[0, rr, mi], wq[1, rr, mi], step, e, self.elem_name, mask)
                            if cutlass.const_expr(not fp32):
                                q = scaled(q, sp2[rr, mi], self.elem_name)
                            afr[2 * e + rr, mi] = q
                self.mma_step(mma, self.token_atoms(target, ntok), afr, bfr, ma=mw, na=ntok)
        if cutlass.const_expr(fp32):
            # Accumulators 0, 1 are weight row g of their m16 atom, 2, 3 row g + 8: one scale each.
            grp = (kt * self.tk) // self.group
            for mi in cutlass.range_constexpr(mw):
                for rr in cutlass.range_constexpr(2):
                    row = warp * self.nw + mi * 16 + rr * 8 + g
                    sv = s_se[row * self.srow + grp].to(Float32)
                    for ni in cutlass.range_constexpr(ntok):
                        for e in cutlass.range_constexpr(2):
                            acc[2 * rr + e, mi, ni] = (
                                acc[2 * rr + e, mi, ni] + sv * target[2 * rr + e, mi, ni]
                            )

    def token_atoms(self, acc, ntok: int):
        """The first ``ntok`` n8 token atoms of swapped accumulators ``(4, m16 atoms, 2)``."""
        return cute.make_tensor(
            acc.iterator, cute.make_layout((4, self.mw, ntok), stride=(1, 4, 4 * self.mw))
        )

    @cute.jit
    def store_swapped(self, tile, acc, warp: Int32, g: Int32, c: Int32):
        """The swapped decode epilogue: accumulator ``2rr + e`` of (m16 atom ``mi``, n8 atom
        ``ni``) is weight row ``16mi + 8rr + g`` of the warp's, token row ``8ni + 2c + e``;
        round once and store each as one element. The four routes are read first, at once
        (why: ``WgmmaMainloop.store_staged``)."""
        m_out, sc, rows, _, nt = tile
        one = self.tensor(m_out.iterator, cute.size(m_out))
        routes = cute.make_rmem_tensor((2, 2), Int32)
        for ni in cutlass.range_constexpr(2):
            for e in cutlass.range_constexpr(2):
                routes[ni, e] = sc[rows + ni * 8 + 2 * c + e]
        for ni in cutlass.range_constexpr(2):
            for e in cutlass.range_constexpr(2):
                route = routes[ni, e]
                if route >= 0:
                    for mi in cutlass.range_constexpr(self.mw):
                        for rr in cutlass.range_constexpr(2):
                            col = nt * self.tn + warp * self.nw + mi * 16 + rr * 8 + g
                            one[route * self.n + col] = acc[2 * rr + e, mi, ni].to(self.output)
