"""``moe.w4a16``: int4-weight x bf16/fp16-activation grouped GEMM over routed tokens.

``out[t, j, :] = round_once(a[t] @ dequant(w[e]).T)`` for every route ``r = t * topk + j`` with
``e = route_ids[t, j]`` valid, where ``dequant(w)[n, k] = int4(w)[n, k] * s[n, k // group]``,
products are accumulated in fp32 by tensor-core MMAs and the sum is rounded once (to nearest
even) to the output dtype. Weights ``w[e_cap, n, k / 2]`` (u8) hold two signed int4 per byte,
in the byte order ``w_layout`` names (``nk`` rows, or ``n64k128`` atoms whose nibbles are in
MMA lane order, see :mod:`b12x_aot.loader.w4a16_layout`: the same bits either way, but for
decode tiles' last fp32 bits). Scales ``s[e_cap, n, k / group]`` are in the activation dtype.
Rows of invalid routes are exact zeros and no weight is read for them. Only ``out`` is
written.

The GEMM walks the blocks that ``moe.route_pack`` wrote into ``scratch`` (see
:mod:`.route_pack` for the layout); it must be launched with the same ``num_tokens``. Grid:
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
so the same bits. On an H200 at 128 routes per expert (4,096 tokens, topk 8, 256 experts)
1.10-1.15x on FC1 and FC2, but 0.94-0.96x where no last block is that short: the op picks
it by the expected share of such experts (``MoeW4A16Op.TAIL_SHARE``).

Per CTA: the block's ``tile_n x k / group`` scale slab is copied to shared memory once, then
``block_m`` (``+ tail_rows``) ``x tile_k`` activation rows (gathered by route, padding rows
skipped) and the ``tile_n x tile_k / 2`` packed weights stream through a ``stages``-deep ``cp.async`` ring
(decode tiles on ``nk`` weights load their few activation rows into registers one k-tile ahead
and store them in the k order of the cheaper dequant; on ``n64k128`` each 4-byte word is copied
straight to its MMA lane's place; see :mod:`._w4a16_mma`). With ``w_copy == "bulk"`` (``n64k128``
decode tiles, ``tile_k`` 128) a k-tile's weights are whole atoms, one contiguous 4 KiB per 64-row
band: one thread of the k-part copies each by ``cp.async.bulk`` onto the slot's mbarrier, which
the part waits on before computing it; the compute reads the atom in its global order. Fewer
instructions and no per-thread 16-byte requests: on an H200 up to 1.3x faster than the cp.async
twin, but up to 11 % slower (the bulk copy's longer latency) in launches of one or two CTAs per
SM (N 256 / N 384 at 1 token without a cluster, tiles the op does not pick there; see
``MoeW4A16Op.TILES``). With ``copy_warps`` 4 (the 256-wide sm_90a wgmma tile) a third
warpgroup past the ``cta_threads`` compute threads issues every copy and keeps only a few
registers (``setmaxnreg``: the two compute warpgroups get the rest); the compute warpgroups
wait on each slot's ``full`` mbarrier (its copiers' ``cp.async`` arrivals) and release it on
its ``empty`` one once the wgmmas that read it are done, so no CTA barrier per k-tile holds
them in step, and their wgmmas are those of the ``copy_warps`` 0 twin: the same bits
(:meth:`W4A16.split_roles`). The tensor-core operand is
``round_to_activation_dtype(int4 * s)`` (:mod:`._w4a16_dequant`), except on decode tiles with
``group % tile_k == 0``, where the exact int4 is the operand and each k-tile's fp32 partial sum
takes its scale in fp32. Two k-loops, chosen by arch and params:

- sm_90a tiles with ``tile_k == 64``, ``stages >= 3``, ``split_k == k_ctas == 1``, whole m64 chunks per
  warpgroup and a ring that can hold the output tile (its epilogue stages it there): ``wgmma``
  with the weights as the register operand (:mod:`._w4a16_wgmma`);
- everything else, every arch: warp-level ``mma.sync`` (:mod:`._w4a16_mma`).

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
:meth:`~._w4a16_mma.MmaSyncMainloop.compute_swapped`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint16, Uint32

from b12x_aot.contract import cdiv
from b12x_aot.loader.w4a16_layout import ATOM_K, BAND, WEIGHT_LAYOUTS

from ._base import AotKernel, dsl_dtype
from ._ptx import cp_async_4, cp_async_16_l2_256, cp_async_bulk_g2s
from ._w4a16_dequant import DTYPES, nibble_mask
from ._w4a16_mma import MmaSyncMainloop
from ._w4a16_tile import OutTile
from ._w4a16_wgmma import WgmmaMainloop
from .route_pack import HEADER_WORDS, scratch_bounds, scratch_words

__all__ = ["W4A16", "smem_bytes"]

# With copy warps: the registers each copying thread keeps (its loop holds a few addresses and
# the activation rows' sources), and the SM's register file, which one CTA per SM shares out.
COPY_REGISTERS = 40
REGISTERS_PER_SM = 65536


def smem_bytes(params: Mapping[str, Any]) -> int:
    """Dynamic shared memory of a variant with these params; the spec's ``launch.smem`` must say
    the same: a ring per k-part (activation tiles of ``block_m + tail_rows`` rows), one scale
    slab, with ``w_copy == "bulk"`` an mbarrier (8 B) per ring slot, and with copy warps two
    (full and empty)."""
    split_k, stages = params["split_k"], params["stages"]
    ring = ring_bytes(
        block_m=params["block_m"] + params.get("tail_rows", 0),
        tile_n=params["tile_n"],
        tile_k=params["tile_k"],
        stages=stages,
    )
    mbarriers = 8 * split_k * stages if params["w_copy"] == "bulk" else 0
    if params.get("copy_warps", 0):
        mbarriers += 16 * stages  # full and empty per ring slot
    return split_k * ring + params["tile_n"] * _scale_row_bytes(params["k"], params["group"], 2) + mbarriers


def ring_bytes(*, block_m: int, tile_n: int, tile_k: int, stages: int) -> int:
    """One k-part's cp.async ring: ``stages`` x (bf16/fp16 activation tile + packed int4 weights)."""
    return stages * (block_m * tile_k * 2 + tile_n * tile_k // 2)


def _scale_row_bytes(k: int, group: int, size: int) -> int:
    """A scale row, padded by 16 B when needed so 8 consecutive rows hit 8 distinct bank groups."""
    row = k // group * size
    return row + (16 if row // 16 % 2 == 0 else 0)


class W4A16(AotKernel, MmaSyncMainloop, WgmmaMainloop):
    def __init__(
        self,
        geometry,
        static,
        *,
        element: str,
        output: str,
        topk: int,
        n: int,
        k: int,
        group: int,
        block_m: int,
        tile_n: int,
        tile_k: int,
        stages: int,
        split_k: int,
        cta_threads: int,
        e_cap: int,
        w_layout: str = "nk",
        k_ctas: int = 1,
        w_copy: str = "cp_async",
        tail_rows: int = 0,
        copy_warps: int = 0,
    ):
        super().__init__(
            geometry,
            static,
            element=element,
            output=output,
            topk=topk,
            n=n,
            k=k,
            group=group,
            block_m=block_m,
            tile_n=tile_n,
            tile_k=tile_k,
            stages=stages,
            split_k=split_k,
            cta_threads=cta_threads,
            e_cap=e_cap,
            w_layout=w_layout,
            k_ctas=k_ctas,
            w_copy=w_copy,
            tail_rows=tail_rows,
            copy_warps=copy_warps,
        )
        if element not in DTYPES:
            raise ValueError(f"element must be bf16 or fp16 (got {element!r})")
        self.elem_name = element
        self.element, self.output = dsl_dtype(element), dsl_dtype(output)
        self.topk, self.n, self.k, self.group = topk, n, k, group
        self.bm, self.tn, self.tk, self.stages, self.e_cap = block_m, tile_n, tile_k, stages, e_cap
        self.atoms = w_layout == "n64k128"  # 64-row atoms, nibbles in MMA lane order
        # split_k k-parts of equal threads each walk k / split_k of the tile (own ring, own
        # named barrier); part 0 then adds the others' fp32 sums in part order and stores.
        self.split, self.cta_threads = split_k, cta_threads
        # k_ctas CTAs of a cluster split k further, each over k / k_ctas with its own parts;
        # rank 0 then adds the other CTAs' sums in rank order (through its shared memory).
        self.k_ctas = k_ctas
        self.threads = cta_threads // max(split_k, 1)  # threads of one k-part
        self.warps = self.threads // 32
        self.nw = tile_n // max(self.warps, 1)  # columns per warp
        self.na, self.ma = self.nw // 8, block_m // 16  # n8 / m16 atoms per warp (not swapped)
        self.qa, self.qw = tile_k // 8, tile_k // 32  # 16-byte chunks per A row / W row
        self.kt_count = k // tile_k // max(split_k * k_ctas, 1)  # k-tiles of one k-part
        # An expert's last block of at most tail_rows real rows rides with the block before it
        # (wgmma tiles): that block's CTAs take bm + tail_rows rows, its own return at once.
        self.tail = tail_rows
        self.mt = block_m + tail_rows  # activation rows a ring slot holds
        self.ring_bytes = ring_bytes(block_m=self.mt, tile_n=tile_n, tile_k=tile_k, stages=stages)
        # copy_warps 4 (wgmma tiles): a warpgroup past the cta_threads compute threads issues
        # every copy, a ring slot handed over by mbarriers (see split_roles).
        self.copy_warps = copy_warps
        self.copiers = 32 * copy_warps if copy_warps else self.threads  # threads that copy
        self.block_threads = cta_threads + 32 * copy_warps
        self.ra = cdiv(self.mt, max(self.copiers // self.qa, 1))  # activation rows per copier
        # Decode blocks mostly hold one or two real rows: their few activation pieces can afford
        # a pass through registers (nk: k, k + 4 pairs, the way the weight dequant takes them)
        # or 4-byte copies (n64k128), each landing as register-move-free MMA fragments. Bigger
        # blocks copy 16 bytes straight to shared memory.
        self.interleave = block_m == 16
        # Each lane loads its own 8 bytes of a weight row per 64-wide k-chunk (w_lane_piece):
        # decode tiles' 16 contiguous k's, or the k's n64k128's lane order gathers there. Other
        # tiles load 16-byte halves of nk rows, broadcast to a lane quad, and pick bytes.
        self.lane_pieces = self.interleave or self.atoms
        # Decode blocks also skip the packed multiply by the scale: a k-tile inside one group
        # accumulates exact int4 products, then takes its scale once, in fp32, per output.
        self.fp32_scale = block_m == 16 and group % tile_k == 0
        # Decode tiles on n64k128 weights swap the MMA roles (weights A, tokens B; each warp
        # holds whole m16 atoms of weight rows): see compute_swapped.
        self.swapped = self.interleave and self.atoms
        # w_copy "bulk": their weight k-tiles (one whole atom per 64-row band) arrive by one
        # cp.async.bulk per band, issued by one thread, on the slot's mbarrier, instead of
        # 16-byte cp.async copies by every thread.
        self.bulk = w_copy == "bulk"
        self.mw = self.nw // 16  # swapped: m16 atoms of weight rows per warp
        self.acc_shape = (4, self.mw, 2) if self.swapped else (4, self.ma, self.na)  # mma.sync loop
        self.out_vec = 16 // (self.output.width // 8)
        self.scale_chunks = k // group * 2 // 16  # 16-byte chunks per scale row
        self.srow = _scale_row_bytes(k, group, 2) // 2  # scale row stride, elements
        problems = [
            (
                not 1 <= split_k <= 15 or cta_threads % (32 * split_k) or (k // tile_k) % split_k,
                "1 <= split_k <= 15 (named barriers 1..15) divides the warps and the k-tiles",
            ),
            (
                w_copy not in ("cp_async", "bulk") or (self.bulk and not (self.swapped and tile_k == ATOM_K)),
                "w_copy in ('cp_async', 'bulk'); bulk: n64k128 decode tiles (block_m 16) with tile_k 128",
            ),
            (
                k_ctas not in (1, 2, 4, 8) or (k // tile_k) % (split_k * k_ctas),
                "k_ctas in (1, 2, 4, 8) and split_k * k_ctas divides the k-tiles",
            ),
            (n % tile_n, "n % tile_n == 0"),
            (k % tile_k or tile_k % 64, "tile_k % 64 == 0 and k % tile_k == 0"),
            (
                cta_threads % 32 or self.nw % 8 or self.nw * self.warps != tile_n,
                "tile_n % (8 * part warps) == 0",
            ),
            (block_m % 16, "block_m % 16 == 0"),
            (
                tail_rows % 16 or not 0 <= tail_rows < block_m,
                "tail_rows % 16 == 0 and 0 <= tail_rows < block_m",
            ),
            (w_layout not in WEIGHT_LAYOUTS, f"w_layout in {WEIGHT_LAYOUTS}"),
            (
                self.atoms and (tile_n % BAND or k % ATOM_K or self._pass_splits_bands()),
                "n64k128: tile_n % 64 == 0, k % 128 == 0, and (cta_threads / split_k) / "
                "(tile_k / 32) divides 64 or is a multiple of it (the rows one weight copy pass takes)",
            ),
            (
                self.swapped and self.nw % 16,
                "n64k128 decode tiles (block_m 16): tile_n % (16 * part warps) == 0 (whole m16 atoms "
                "of weight rows per warp)",
            ),
            # A 64-wide k-chunk's MMA steps take their scale where a group starts: at step
            # starts (group 16, 32) or chunk starts (multiples of 64), never inside a step.
            (
                (group % 64 and 64 % group) or group % 16 or (k // group) % 8,
                "group in (16, 32) or group % 64 == 0, and (k // group) % 8 == 0",
            ),
            (self.copiers % self.qa, "copying threads % (tile_k // 8) == 0"),
            (
                self.copiers // max(self.qw, 1) % 8,
                "copying threads // (tile_k // 32) % 8 == 0",
            ),  # see issue()
            (
                copy_warps not in (0, 4)
                or (
                    copy_warps
                    and (split_k, k_ctas, block_m == 16, tile_k, cta_threads % 128) != (1, 1, False, 64, 0)
                ),
                "copy_warps in (0, 4); 4: the wgmma loop's split_k == k_ctas == 1, block_m > 16, tile_k 64 "
                "and whole warpgroups",
            ),
            (
                copy_warps and self.compute_registers() <= self.launch_registers(),
                "copy warps leave the compute threads more registers than the launch gives each thread",
            ),
            (
                tuple(static.block) != (self.block_threads, 1, 1),
                "launch.block == [cta_threads + 32 * copy_warps, 1, 1]",
            ),
            (self.kt_count < stages or stages < 2, "2 <= stages <= k // tile_k // (split_k * k_ctas)"),
            # The rank is x % k_ctas and the reduction targets cluster rank 0: only a launch in
            # clusters of exactly k_ctas CTAs along x sums every k share.
            ((static.cluster or (1, 1, 1)) != (k_ctas, 1, 1), "launch.cluster == [k_ctas, 1, 1]"),
            # part 0 adds the other parts' sums from their rings' memory, KiB-aligned per part
            (
                (split_k + k_ctas - 2) * tile_n * block_m * 4 > split_k * self.ring_bytes,
                "the split_k and k_ctas sums fit the rings",
            ),
            (split_k > 1 and self.ring_bytes % 1024, "a k-part's ring is whole KiB"),
        ]
        bad = [rule for failed, rule in problems if failed]
        want = smem_bytes(self.params)
        if bad or self.static.smem != want:
            raise ValueError(
                f"moe.w4a16 params break {bad or 'nothing'}; launch.smem must be {want} B "
                f"(got {self.static.smem} B)"
            )

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
        tid, _, _ = cute.arch.thread_idx()
        # CTAs start in launch order, x fastest: walk a block's n tiles in a row, so the
        # block's gathered activation rows stay hot in L2 for its tiles, an expert's weight rows
        # are read in address order, and the grid's empty trailing blocks start last.
        bx, by, _ = cute.arch.block_idx()
        grid_x, _, _ = cute.arch.grid_dim()
        rank = Int32(0)  # in the cluster: a cluster's k_ctas CTAs are consecutive in x
        if cutlass.const_expr(self.k_ctas > 1):
            rank, bx, grid_x = bx % self.k_ctas, bx // self.k_ctas, grid_x // self.k_ctas
        tiles = self.n // self.tn
        cta = bx + by * grid_x
        blk, nt = cta // tiles, cta % tiles
        bm = self.bm
        routes, live, nblk = scratch_bounds(
            num_tokens, num_experts, topk=self.topk, block_m=bm, e_cap=self.e_cap
        )
        words = scratch_words(nblk, bm)
        sc = self.tensor(scratch, words)
        m_out = self.vectors(out, self.out_vec, routes * self.n // self.out_vec)
        # The block's expert and its rows' routes are read together (each index is inside the
        # scratch whatever the block holds), ahead of the test on the expert: behind it, the
        # routes would wait for the expert's round trip before the first copy could go out.
        rows = HEADER_WORDS + nblk + blk * bm
        used, expert = sc[0], sc[HEADER_WORDS + blk]
        copier = tid % self.threads  # this thread among those that copy
        if cutlass.const_expr(self.copy_warps):  # the copy warpgroup's (the others' go unused)
            copier = cutlass.max(tid - self.cta_threads, Int32(0))
        row_routes = self.block_routes(sc, rows, words - 1, copier)
        if blk < used:
            if expert >= 0 and expert < live:
                reach = Int32(bm)
                if cutlass.const_expr(self.tail > 0):
                    reach = self.rows_reached(sc, blk, rows, expert, nblk)
                if reach > 0:
                    self.gemm_block(
                        m_out, a, w, scales, sc, rows, reach, row_routes, expert, nt, num_tokens, tid, rank
                    )
            elif rank == 0:  # one CTA of a cluster writes the zeros
                zero = cute.make_rmem_tensor((self.out_vec,), self.output)
                zero.fill(0.0)
                per_row = self.tn // self.out_vec
                for i in range(tid, bm * per_row, self.block_threads):
                    route = sc[rows + i // per_row]
                    if route >= 0:
                        col = route * (self.n // self.out_vec) + nt * per_row + i % per_row
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
        prev = sc[HEADER_WORDS + cutlass.max(blk - 1, 0)]
        nxt = sc[HEADER_WORDS + cutlass.min(blk + 1, nblk - 1)]
        own_row = sc[rows + self.tail]
        next_row = sc[cutlass.min(rows + self.bm, HEADER_WORDS + nblk + (nblk - 1) * self.bm) + self.tail]
        reach = Int32(self.bm)
        if (blk > 0) & (prev == expert) & (own_row < 0):
            reach = Int32(0)
        if (blk + 1 < sc[0]) & (nxt == expert) & (next_row < 0):
            reach = Int32(self.mt)
        return reach

    @cute.jit
    def block_routes(self, sc, rows: Int32, last: Int32, tid: Int32):
        """The route of the block row each activation copy pass of part thread ``tid`` takes
        (:meth:`a_piece`), read at an index clamped to the scratch's ``last`` word: rows past
        the block's reach are not used (:meth:`gemm_block`)."""
        row_routes = cute.make_rmem_tensor((self.ra,), Int32)
        for i in cutlass.range_constexpr(self.ra):
            r, _ = self.a_piece(tid, i)
            row_routes[i] = sc[cutlass.min(rows + r, last)]
        return row_routes

    def a_passes(self, rows: int = 0) -> int:
        """Activation copy passes that cover a tile's first ``rows`` rows (all, when 0)."""
        return cdiv(rows, self.copiers // self.qa) if rows else self.ra

    def a_piece(self, tid, i: int):
        """Row and 16-byte piece (of ``tile_k / 8``) of the block's activations that copying
        thread ``tid`` loads in pass ``i``: consecutive threads take a row's consecutive pieces."""
        return tid // self.qa + i * (self.copiers // self.qa), tid % self.qa

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
        place (:meth:`a_lane_word`) by a 4-byte ``cp.async``, in the k-tile's commit group.
        Bulk-copied weights (``w_copy == "bulk"``) go by the part's thread 0, one copy per band,
        on slot ``slot``'s mbarrier (``mbar + slot``). ``rows``: when set, the tile's rows from
        there on are padding, and their copy passes are left out."""
        qa = self.qa
        if cutlass.const_expr(self.interleave and self.atoms):
            for i in cutlass.range_constexpr(self.ra):
                r, q = self.a_piece(tid, i)
                if a_src[i] >= 0:
                    src = g_a[None, a_src[i] + kt * qa].iterator.toint()
                    for s in cutlass.range_constexpr(4):
                        cp_async_4((s_a.iterator + self.a_lane_word(slot, r, q, s)).toint(), src + 4 * s)
        elif cutlass.const_expr(self.interleave):
            # Only warps over real rows take this branch: decode blocks mostly hold one or two.
            top = a_src[0]
            for i in cutlass.range_constexpr(1, self.ra):
                top = cutlass.max(top, a_src[i])
            if cute.arch.vote_any_sync(top >= 0):
                self.pair_rows(slot, staged, s_a, a_src, tid)
                if (kt + 1) % self.kt_count != 0:  # k-tile kt + 1 is in this k-part too
                    self.stage_rows(kt + 1, staged, g_a, a_src)
        else:
            for i in cutlass.range_constexpr(self.a_passes(rows)):
                r, q = self.a_piece(tid, i)
                if a_src[i] >= 0:
                    cute.copy(
                        atom_a,
                        g_a[None, a_src[i] + kt * qa],
                        s_a[None, (slot * self.mt + r) * qa + (q ^ (r % 8))],
                    )
        if cutlass.const_expr(self.bulk):
            self.issue_bulk(kt, slot, g_w, s_w, w_src, mbar, tid)
        else:
            self.issue_weights(kt, slot, g_w, s_w, w_src, tid)

    @cute.jit
    def issue_bulk(self, kt: Int32, slot: Int32, g_w, s_w, w_src, mbar, tid: Int32):
        """Bulk-copy k-tile ``kt``'s weight atoms (one per 64-row band) into slot ``slot``, in
        their global order (see :meth:`w_lane_piece`), completing on the slot's mbarrier."""
        if tid == 0:
            bands, atom = self.tn // BAND, BAND * ATOM_K // 2
            # The part's reads of this slot (k-tile kt - stages, before the part barrier) come
            # before the async proxy's writes into it.
            cute.arch.fence_proxy("async.shared", space="cta")
            bar = mbar + slot
            cute.arch.mbarrier_arrive_and_expect_tx(bar, bands * atom)
            at = bar.toint()
            dst = s_w[None, slot * (self.tn * self.qw)].iterator.toint()
            for b in cutlass.range_constexpr(bands):
                src = g_w[None, w_src + self.w_chunk(b * BAND, kt * self.qw)].iterator.toint()
                cp_async_bulk_g2s(dst + b * atom, src, atom, at)

    @cute.jit
    def issue_weights(self, kt: Int32, slot: Int32, g_w, s_w, w_src, tid: Int32):
        """``cp.async`` k-tile ``kt``'s weights into slot ``slot``, 16 bytes per copy."""
        qw = self.qw
        # Weight copy i of this thread: 16-byte piece tid % qw of row tid // qw + i * rows. rows
        # is a multiple of 8, so every copy has the same piece and swizzle: one address pair per
        # k-tile plus constant offsets.
        total, rows, copiers = self.tn * qw, self.copiers // qw, self.copiers
        n0, qq = tid // qw, tid % qw
        dst0 = s_w[
            None, slot * total + (qq // 2) * (self.tn * 2) + n0 * 2 + ((qq % 2) ^ ((n0 // 4) % 2))
        ].iterator.toint()
        src0 = g_w[None, w_src + self.w_chunk(n0, kt * qw + qq)].iterator.toint()
        for i in cutlass.range_constexpr(cdiv(total, copiers)):
            dst, src = dst0 + i * rows * 32, src0 + self.w_chunk(i * rows, 0) * 16
            if cutlass.const_expr(total % copiers == 0):
                cp_async_16_l2_256(dst, src)
            else:
                if tid + i * copiers < total:
                    cp_async_16_l2_256(dst, src)

    def w_chunk(self, row, chunk):
        """The 16-byte unit of the tile's weight row ``row`` at k-chunk ``chunk`` (32 k), from
        the tile's first unit, in the ``w_layout`` byte order (:mod:`~b12x_aot.loader.
        w4a16_layout`; an n64k128 tile starts a band); a constant for constant arguments."""
        k32 = self.k // 32
        if not self.atoms:
            return row * k32 + chunk
        per_row = ATOM_K // 32
        return (
            (row // BAND) * BAND * k32
            + (chunk // per_row) * BAND * per_row
            + (row % BAND) * per_row
            + chunk % per_row
        )

    def w_lane_piece(self, slot, j: int, row, g, c):
        """Where lane ``c`` (lane % 4) finds its 8 bytes of weight row ``row`` (``row % 8 == g``)
        in 64-wide k-chunk ``j`` of ring slot ``slot``, in 8-byte units: bytes ``[8c, 8c + 8)``
        of the row's 32, in the 16-byte half that :meth:`issue_weights` swapped when ``row & 4``; or,
        bulk-copied, where the atom's row-major order puts them (64 bytes per row)."""
        if self.bulk:
            return slot * (self.tn * self.qw * 2) + row * (2 * self.qw) + j * 4 + c
        return (
            slot * (self.tn * self.qw * 2) + j * (self.tn * 4) + row * 4 + ((c // 2) ^ (g // 4)) * 2 + c % 2
        )

    def _pass_splits_bands(self) -> bool:
        """Whether a weight copy pass (``threads / (tile_k / 32)`` rows) straddles 64-row
        bands: its offset from pass 0 would then depend on the thread's row."""
        rows = self.copiers // max(self.qw, 1)
        return rows % BAND != 0 and BAND % max(rows, 1) != 0

    @cute.jit
    def gemm_block(
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
    ):
        """The ``reach x tile_n`` tile from one expert block's first row: ``block_m`` rows, or
        with the next block's few rows (see :meth:`rows_reached`; ``row_routes``:
        :meth:`block_routes`). Mainloop and epilogue."""
        if cutlass.const_expr(self.tail and not self.uses_wgmma()):
            raise ValueError("tail_rows > 0 needs a wgmma tile (sm_90a, see uses_wgmma)")
        bm, tn, tk, stages = self.bm, self.tn, self.tk, self.stages
        qa, qw = self.qa, self.qw
        lane = tid % 32
        elem = self.element
        k32 = self.k // 32

        a_stage = self.mt * tk * 2
        smem = cutlass.memory.SmemAllocator().allocate_array(Uint8, self.static.smem, byte_alignment=1024)
        # This thread's k-part, its thread index in the part, and the part's ring.
        part, tid_all, base = Int32(0), tid, smem
        if cutlass.const_expr(self.split > 1):
            part, tid = tid // self.threads, tid % self.threads
            base = smem + cute.assume(part * self.ring_bytes, divby=1024)  # keeps the alignment
        k0 = (rank * self.split + part) * self.kt_count  # the part's first k-tile
        # Activations. Interleaved (block_m 16): one MMA A fragment (swapped: the B fragments
        # of both token atoms) per 16-byte unit, in the weights' k order (nk: paired in
        # registers, see pair_rows; n64k128: 4-byte copies, see issue), read by one
        # ld.shared.v4 per MMA step.
        # Otherwise plain rows of 16-byte chunks (chunk q at q ^ (row % 8)), filled by
        # 16-byte cp.async and read by ldmatrix (conflict-free thanks to the swizzle).
        # Weights: per 64-wide k-chunk, 32 bytes per row n, its 16-byte halves swapped when
        # n & 4: eight consecutive rows' same halves then hit distinct banks. Bulk-copied
        # (w_copy bulk): the atoms as they are in global memory, 64 bytes per row.
        s_a32 = self.vectors(cute.recast_ptr(base, dtype=Uint32), 4, stages * self.mt * qa)
        s_a = s_a32
        if cutlass.const_expr(self.interleave):
            s_a = self.tensor(cute.recast_ptr(base, dtype=Uint32), stages * bm * tk // 2)
        w_base = base + stages * a_stage
        s_w = self.vectors(w_base, 16, stages * tn * qw)
        s_wv = self.vectors(cute.recast_ptr(w_base, dtype=Uint32), 2, stages * tn * qw * 2)
        if cutlass.const_expr(not self.lane_pieces):
            s_wv = self.vectors(cute.recast_ptr(w_base, dtype=Uint32), 4, stages * tn * qw)
        s_base = smem + self.split * self.ring_bytes
        # Past the scale slab: the ring's mbarriers (bulk weight copies, or copy warps).
        mbars = cute.recast_ptr(s_base + tn * self.srow * 2, dtype=Int64)
        s_s = self.vectors(cute.recast_ptr(s_base, dtype=elem), 8, tn * self.srow // 8)
        s_s16 = self.tensor(cute.recast_ptr(s_base, dtype=Uint16), tn * self.srow)
        s_se = self.tensor(cute.recast_ptr(s_base, dtype=elem), tn * self.srow)

        pieces = cutlass.max(num_tokens, Int32(1)) * (self.k // 8)  # 16-byte pieces of a
        g_a = self.vectors(cute.recast_ptr(a, dtype=Uint32), 4, pieces)
        atom_a = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
            Uint32,
            num_bits_per_copy=128,
        )
        g_w = self.vectors(w, 16, self.e_cap * self.n * k32)
        chunks = self.scale_chunks
        g_s = self.vectors(scales, 8, self.e_cap * self.n * chunks)
        atom_s = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
            elem,
            num_bits_per_copy=128,
        )
        mma = cute.make_mma_atom(cute.nvgpu.warp.MmaF16BF16Op(elem, Float32, (16, 8, 16)))

        row0 = expert * self.n + nt * tn
        w_src = row0 * k32
        slab = (atom_s, g_s, s_s, row0)
        tile = OutTile(m_out, sc, rows, reach, nt)
        if cutlass.const_expr(self.copy_warps):
            copies = (atom_a, g_a, s_a, None, None, g_w, s_w, w_src, None)
            self.split_roles(tile, row_routes, base, s_wv, s_s16, mbars, copies, slab, num_tokens, tid)
        else:
            # This thread's activation rows: gathered token offsets, and whether to load them.
            a_src = self.activation_sources(tid, reach, row_routes)
            staged = None  # interleaved nk tiles' next activation pieces
            if cutlass.const_expr(self.interleave and not self.atoms):
                staged = cute.make_rmem_tensor((4, self.ra), Uint32)
                self.stage_rows(k0, staged, g_a, a_src)

            mbar = None  # this part's slot mbarriers, where weights arrive by bulk copies
            if cutlass.const_expr(self.bulk):
                if tid_all == 0:
                    for b in cutlass.range_constexpr(self.split * stages):
                        cute.arch.mbarrier_init(mbars + b, 1)  # the producer's arrive, plus the bytes
                    cute.arch.mbarrier_init_fence()
                cute.arch.sync_threads()
                mbar = mbars + part * stages

            # The block's scale slab, once, by every thread, in the same commit group as k-tile 0.
            self.copy_slab(slab, tid_all, self.cta_threads)
            for s in cutlass.range_constexpr(self.tiles_ahead()):
                self.issue(k0 + s, Int32(s), atom_a, g_a, s_a, a_src, staged, g_w, s_w, w_src, mbar, tid)
                cute.arch.cp_async_commit_group()
            if cutlass.const_expr(self.split > 1):
                # The k-loop syncs parts alone: the slab that every part reads must land first.
                cute.arch.cp_async_wait_group(stages - 2)
                cute.arch.sync_threads()

            mask = nibble_mask(num_tokens)  # the dequant's nibble mask, held in a register
            if cutlass.const_expr(self.uses_wgmma()):
                self.mainloop_wgmma(
                    tile,
                    base,
                    s_wv,
                    s_s16,
                    (atom_a, g_a, s_a, a_src, staged, g_w, s_w, w_src, mbar),
                    tid,
                    mask,
                )
            else:
                # ldmatrix address of step 0: lane 8m + i reads row (m % 2) * 8 + i of an m16 atom, at
                # 16-byte chunk m // 2, swizzled by the row (whose low 3 bits are i). Step s reads chunk
                # 2s + m // 2: the address XOR (s << 5), as rows and the tile base are 128-byte aligned.
                a_row0 = (
                    base.toint()
                    + (((lane // 8) % 2) * 8 + lane % 8) * (qa * 16)
                    + (((lane // 16) ^ (lane % 8)) * 16)
                )
                self.mainloop_mma(
                    tile,
                    (a_row0, s_a32, s_wv, s_s16, s_se, mma, mask),
                    (atom_a, g_a, s_a, a_src, staged, g_w, s_w, w_src, mbar),
                    (tid, part, rank, k0, smem),
                )

    @cute.jit
    def activation_sources(self, tid: Int32, reach: Int32, row_routes):
        """The 16-byte piece of ``a`` at k-tile 0 that each activation copy pass of copying
        thread ``tid`` takes (:meth:`a_piece`), or -1 where its row is past ``reach`` or padding."""
        a_src = cute.make_rmem_tensor((self.ra,), Int32)
        for i in cutlass.range_constexpr(self.ra):
            r, q = self.a_piece(tid, i)
            a_src[i] = -1
            if (r < reach) & (row_routes[i] >= 0):
                a_src[i] = (row_routes[i] // self.topk) * (self.k // 8) + q
        return a_src

    @cute.jit
    def copy_slab(self, slab, tid: Int32, stride: cutlass.Constexpr[int]):
        """``cp.async`` the block's ``tile_n x k / group`` scale slab into shared memory, thread
        ``tid`` of ``stride`` taking every ``stride``-th 16-byte chunk (uncommitted: it joins
        k-tile 0's group)."""
        atom_s, g_s, s_s, row0 = slab
        chunks = self.scale_chunks
        for i in range(tid, self.tn * chunks, stride):
            cute.copy(
                atom_s, g_s[None, row0 * chunks + i], s_s[None, (i // chunks) * (self.srow // 8) + i % chunks]
            )

    @cute.jit
    def split_roles(self, tile, row_routes, base, s_wv, s_s16, full, copies, slab, num_tokens, tid):
        """``copy_warps``: the warps past the ``cta_threads`` compute threads issue every copy
        (:meth:`produce`), the compute warpgroups only wait, dequantize, issue ``wgmma`` and
        store. No CTA barrier per k-tile: ring slot ``s`` changes hands on two mbarriers past
        the scale slab, ``full[s]`` (each copying thread arrives once its copies into the slot
        landed) and ``empty[s] = full[stages + s]`` (each compute thread arrives once the
        wgmmas that read the slot, and its own weight loads from it, are done). The compute
        warps run the same wgmmas in the same order as without copy warps: the same bits.
        ``full``: the mbarriers past the scale slab."""
        if cutlass.const_expr(not self.uses_wgmma()):
            raise ValueError("copy_warps > 0 needs a wgmma tile (sm_90a, see uses_wgmma)")
        stages = self.stages
        if tid == 0:
            for s in cutlass.range_constexpr(stages):
                cute.arch.mbarrier_init(full + s, self.copiers)
                cute.arch.mbarrier_init(full + stages + s, self.cta_threads)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        # One CTA per SM: the copy warpgroup hands all but COPY_REGISTERS of its registers per
        # thread to the compute warpgroups (setmaxnreg), which need more than an even share.
        if tid >= self.cta_threads:
            cute.arch.setmaxregister_decrease(COPY_REGISTERS)
            self.produce(tile.reach, row_routes, copies, slab, full, tid - self.cta_threads)
        else:
            cute.arch.setmaxregister_increase(self.compute_registers())
            mask = nibble_mask(num_tokens)
            self.mainloop_wgmma(tile, base, s_wv, s_s16, copies, tid, mask, pipe=full)

    @cute.jit
    def produce(self, reach: Int32, row_routes, copies, slab, full, tid: Int32):
        """The copy warps' loop (``tid``: the thread among them; ``row_routes``: its rows',
        :meth:`block_routes`): the scale slab, then each k-tile into its ring slot once the
        compute warps have released the slot's last use, each thread arriving on the slot's
        ``full`` barrier when its copies land. The copies land before the threads exit."""
        atom_a, g_a, s_a, _, _, g_w, s_w, w_src, _ = copies
        a_src = self.activation_sources(tid, reach, row_routes)
        self.copy_slab(slab, tid, self.copiers)
        stages = self.stages
        for kt in range(self.kt_count):
            slot = kt % stages
            if kt >= stages:
                cute.arch.mbarrier_wait(full + stages + slot, (kt // stages + 1) % 2)
            self.issue(kt, slot, atom_a, g_a, s_a, a_src, None, g_w, s_w, w_src, None, tid)
            cute.arch.cp_async_mbarrier_arrive_noinc(full + slot)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)

    def launch_registers(self) -> int:
        """Registers per thread at launch (one CTA per SM): the register file over the CTA's
        threads, in multiples of 8, at most 255."""
        return min(REGISTERS_PER_SM // self.block_threads, 255) // 8 * 8

    def compute_registers(self) -> int:
        """Registers per compute thread with copy warps: what the copy warpgroup leaves of the
        CTA's launch allocation, in setmaxnreg's multiples of 8, at most 256."""
        pool = self.launch_registers() * self.block_threads
        share = (pool - 32 * self.copy_warps * COPY_REGISTERS) // self.cta_threads
        return min(share // 8 * 8, 256)

    def tiles_ahead(self) -> int:
        """k-tiles in flight ahead of the one computing: the ring's other slots, but one fewer
        where the wgmma loop lets a k-tile's wgmmas run across the next k-tile's barrier
        (:meth:`overlaps_ktiles`): the slot it refills is then two k-tiles old."""
        return self.stages - 2 if self.overlaps_ktiles() else self.stages - 1

    def overlaps_ktiles(self) -> bool:
        """Whether the wgmma loop keeps a k-tile's last chunks running across the next k-tile's
        barrier: a warpgroup of several m64 chunks, and a ring deep enough that this still
        leaves two k-tiles in flight."""
        return self.uses_wgmma() and self.wg_chunks() > 1 and self.stages >= 4

    def uses_wgmma(self) -> bool:
        """sm_90a prefill tiles run warpgroup MMAs: weights as the register A operand (64 rows per
        warpgroup and m64 chunk), the block's activation rows as the shared-memory B operand. The
        epilogue stages the output tile, rows one 16-byte vector longer, in the ring: it has to fit."""
        return (
            self.target_arch() == "sm_90a"
            and not self.interleave
            and self.split == 1
            and self.k_ctas == 1
            and self.tk == 64
            and self.stages >= 3
            and self.threads % 128 == 0
            and self.tn % 64 == 0
            and (self.tn // 64) % (self.threads // 128) == 0
            and self.mt * (self.tn + self.out_vec) * (self.output.width // 8) <= self.ring_bytes
        )
