"""``moe.w4a16``: int4-weight x bf16/fp16-activation grouped GEMM over routed tokens.

``out[t, j, :] = round_once(a[t] @ dequant(w[e]).T)`` for every route ``r = t * topk + j`` with
``e = route_ids[t, j]`` valid, where ``dequant(w)[n, k] = int4(w)[n, k] * s[n, k // group]``,
products are accumulated in fp32 by warp-level ``mma.sync`` m16n8k16, and the sum is rounded
once (to nearest even) to the output dtype. Weights ``w[e_cap, n, k / 2]`` (u8) hold two signed
int4 per byte, low nibble first; scales ``s[e_cap, n, k / group]`` are in the activation dtype.
Rows of invalid routes are exact zeros and no weight is read for them. Only ``out`` is written.

Tensor-core operands, two ways (both deterministic; chosen by the variant's params):

- decode tiles (``block_m == 16`` and ``group % tile_k == 0``): the exact int4 is the operand;
  each k-tile's fp32 partial sum is multiplied by its scale in fp32 and added to the output
  accumulator (``dequant`` is used exactly; one packed multiply per weight pair saved);
- otherwise: ``round_to_activation_dtype(int4 * s)`` is the operand.

The GEMM walks the blocks that ``moe.route_pack`` wrote into ``scratch`` (see
:mod:`.route_pack` for the layout); it must be launched with the same ``num_tokens``. Grid:
``(max_blocks, n / tile_n)``; CTA ``(b, j)`` computes the ``block_m x tile_n`` tile of block
``b``, or fills its rows with zeros when ``b`` is a zero-bucket block (or names an expert at or
past ``min(num_experts, e_cap)``); CTAs past the blocks used return at once.

Per CTA: the block's ``tile_n x k / group`` scale slab is copied to shared memory once, then
``block_m x tile_k`` activation rows (gathered by route, padding rows skipped) and the
``tile_n x tile_k / 2`` packed weights stream through a ``stages``-deep ``cp.async`` ring.
Warps split ``tile_n`` only: each warp owns every row and ``tile_n / warps`` columns, and every
warp walks the same k-slices in the same order. Lane ``(g, c) = (lane // 4, lane % 4)`` of a
warp takes, for each 64-wide k-chunk, the 16 contiguous k's ``[16c, 16c + 16)`` of its weight
rows (8 bytes, one ``ld.shared.v2``) and of its activation rows, so neither operand needs a
shuffle: MMA k-slot ``2c + v`` of step ``s`` is k ``16c + 4s + v``, slot ``2c + 8 + v`` is k
``16c + 4s + 2 + v``, identically for A and B. Nibbles become operands with ``prmt`` + one
``lop3`` (magic-exponent trick: ``0x4300 | (q ^ 8)`` is the bf16 ``136 + q``) and one exact
packed subtract, then (non-decode tiles) one packed multiply by the scale.

CTA-size invariance: each accumulator element receives the same MMAs, on the same operand
values, in the same k order, whatever ``cta_threads`` is; only which warp issues them changes.
So variants that differ only in ``cta_threads`` give bit-identical outputs.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint16, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ._base import AotKernel, dsl_dtype
from .route_pack import HEADER_WORDS

__all__ = ["W4A16", "smem_bytes"]

# Per activation dtype: magic high half for 128 + u (bf16) / 1024 + u (fp16) with u = q ^ 8,
# the packed pair (1, 1) and the packed pair -(magic + 8), so (x * 1) + bias = q exactly.
_MAGIC = {"bf16": (0x43084308, 0x3F803F80, 0xC308C308), "fp16": (0x64086408, 0x3C003C00, 0xE408E408)}
_FMA = {"bf16": "fma.rn.bf16x2", "fp16": "fma.rn.f16x2"}


def smem_bytes(
    *, element: str, k: int, group: int, block_m: int, tile_n: int, tile_k: int, stages: int
) -> int:
    """Dynamic shared memory of a variant; the spec's ``launch.smem`` must say the same."""
    size = 2 if element in ("bf16", "fp16") else 0
    return stages * (block_m * tile_k * size + tile_n * tile_k // 2) + tile_n * _scale_row_bytes(
        k, group, size
    )


def _scale_row_bytes(k: int, group: int, size: int) -> int:
    """A scale row, padded by 16 B when needed so 8 consecutive rows hit 8 distinct bank groups."""
    row = k // group * size
    return row + (16 if row // 16 % 2 == 0 else 0)


@dsl_user_op
def _asm_u32(ptx: str, *operands: Uint32, loc=None, ip=None) -> Uint32:
    """One pure PTX instruction with a ``.b32`` result and ``.b32`` operands."""
    values = [Uint32(x).ir_value(loc=loc, ip=ip) for x in operands]
    constraint = "=r" + ",r" * len(values)
    return Uint32(
        llvm.inline_asm(
            T.i32(),
            values,
            ptx,
            constraint,
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def _cp_async_16_l2_256(dst: Int32, src: Int64, *, loc=None, ip=None) -> None:
    """16-byte ``cp.async`` with an L2 hint to fetch the surrounding 256 bytes.

    A weight row is read 32 or 64 bytes per k-tile, so the next k-tiles can find theirs in L2.
    On an H200 this measured neutral against the default 128-byte hint (decode within noise).
    """
    llvm.inline_asm(
        None,
        [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip)],
        "cp.async.cg.shared.global.L2::256B [$0], [$1], 16;",
        "r,l,~{memory}",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


class W4A16(AotKernel):
    def __init__(
        self,
        geometry,
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
        cta_threads: int,
        e_cap: int,
    ):
        super().__init__(
            geometry,
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
            cta_threads=cta_threads,
            e_cap=e_cap,
        )
        if element not in _MAGIC:
            raise ValueError(f"element must be bf16 or fp16 (got {element!r})")
        self.element, self.output = dsl_dtype(element), dsl_dtype(output)
        self.magic, self.one, self.bias = _MAGIC[element]
        self.fma = _FMA[element]
        self.topk, self.n, self.k, self.group = topk, n, k, group
        self.bm, self.tn, self.tk, self.stages, self.threads, self.e_cap = (
            block_m,
            tile_n,
            tile_k,
            stages,
            cta_threads,
            e_cap,
        )
        self.warps = cta_threads // 32
        self.nw = tile_n // max(self.warps, 1)  # columns per warp
        self.na, self.ma = self.nw // 8, block_m // 16  # n8 / m16 atoms per warp
        self.qa, self.qw = tile_k // 8, tile_k // 32  # 16-byte chunks per A row / W row
        self.kt_count = k // tile_k
        self.ra = -(-block_m // max(cta_threads // self.qa, 1))  # activation rows per thread
        # Decode blocks hold one or two real rows: their few activation copies can afford 4-byte
        # granularity, which buys register-move-free MMA fragments. Bigger blocks copy 16 bytes.
        self.interleave = block_m == 16
        # Decode blocks also skip the packed multiply by the scale: a k-tile inside one group
        # accumulates exact int4 products, then takes its scale once, in fp32, per output.
        self.fp32_scale = block_m == 16 and group % tile_k == 0
        self.out_vec = 16 // (self.output.width // 8)
        self.scale_chunks = k // group * 2 // 16  # 16-byte chunks per scale row
        self.srow = _scale_row_bytes(k, group, 2) // 2  # scale row stride, elements
        problems = [
            (n % tile_n, "n % tile_n == 0"),
            (k % tile_k or tile_k % 64, "tile_k % 64 == 0 and k % tile_k == 0"),
            (cta_threads % 32 or self.nw % 8 or self.nw * self.warps != tile_n, "tile_n % (8 * warps) == 0"),
            (block_m % 16, "block_m % 16 == 0"),
            (group % 16 or (k // group) % 8, "(k // group) % 8 == 0"),
            (cta_threads % self.qa, "cta_threads % (tile_k // 8) == 0"),
            (self.kt_count < stages or stages < 2, "2 <= stages <= k // tile_k"),
        ]
        bad = [rule for failed, rule in problems if failed]
        want = smem_bytes(
            element=element, k=k, group=group, block_m=block_m, tile_n=tile_n, tile_k=tile_k, stages=stages
        )
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
        blk, nt, _ = cute.arch.block_idx()
        bm = self.bm
        routes = cutlass.max(num_tokens, Int32(0)) * self.topk
        nblk = (routes + bm - 1) // bm + cutlass.min(routes, Int32(self.e_cap + 1))
        sc = cute.make_tensor(scratch, cute.make_layout(HEADER_WORDS + nblk * (1 + bm)))
        m_out = cute.make_tensor(
            out, cute.make_layout((self.out_vec, routes * self.n // self.out_vec), stride=(1, self.out_vec))
        )
        if blk < sc[0]:
            expert = sc[HEADER_WORDS + blk]
            rows = HEADER_WORDS + nblk + blk * bm
            live = cutlass.min(cutlass.max(num_experts, Int32(0)), Int32(self.e_cap))
            if expert >= 0 and expert < live:
                self.gemm_block(m_out, a, w, scales, sc, rows, expert, nt, num_tokens, tid)
            else:
                zero = cute.make_rmem_tensor((self.out_vec,), self.output)
                zero.fill(0.0)
                per_row = self.tn // self.out_vec
                for i in range(tid, bm * per_row, self.threads):
                    route = sc[rows + i // per_row]
                    if route >= 0:
                        col = route * (self.n // self.out_vec) + nt * per_row + i % per_row
                        cute.autovec_copy(zero, m_out[None, col])

    @cute.jit
    def issue(self, kt: Int32, slot: Int32, atom_a, g_a, s_a, a_src, a_ok, g_w, s_w, w_src, tid: Int32):
        """Start the ``cp.async`` copies of k-tile ``kt`` into ring slot ``slot``."""
        qa, qw = self.qa, self.qw
        rows_per_pass = self.threads // qa
        q = tid % qa
        units = self.tk // 4  # 16-byte units per (row g, row g + 8) pair of an m16 atom
        for i in cutlass.range_constexpr(self.ra):
            r = tid // qa + i * rows_per_pass
            if a_ok[i] != 0:
                src = a_src[i] + kt * (self.tk // 2)  # in 4-byte words
                if cutlass.const_expr(self.interleave):
                    # Words 4q..4q+3 of row r, each to its place in the row-interleaved layout.
                    g, h = r % 8, (r % 16) // 8
                    base = slot * (2 * self.bm * units) + (r // 16) * (32 * units) + g * (4 * units) + h
                    for v in cutlass.range_constexpr(4):
                        dst = base + (((2 * q + v // 2) ^ g) * 4) + (v % 2) * 2
                        cute.copy(atom_a, g_a[None, src + v], s_a[None, dst])
                else:
                    cute.copy(
                        atom_a, g_a[None, src // 4], s_a[None, (slot * self.bm + r) * qa + (q ^ (r % 8))]
                    )
        total = self.tn * qw
        for i in cutlass.range_constexpr(-(-total // self.threads)):
            c = tid + i * self.threads
            n_, qq = c // qw, c % qw
            dst = slot * total + (qq // 2) * (self.tn * 2) + n_ * 2 + qq % 2
            src = g_w[None, w_src + n_ * (self.k // 32) + kt * qw + qq].iterator.toint()
            if cutlass.const_expr(total % self.threads == 0):
                _cp_async_16_l2_256(s_w[None, dst].iterator.toint(), src)
            else:
                if c < total:
                    _cp_async_16_l2_256(s_w[None, dst].iterator.toint(), src)

    @cute.jit
    def gemm_block(
        self, m_out, a, w, scales, sc, rows: Int32, expert: Int32, nt: Int32, num_tokens: Int32, tid: Int32
    ):
        """The ``block_m x tile_n`` tile of one expert block: mainloop and epilogue."""
        bm, tn, tk, stages = self.bm, self.tn, self.tk, self.stages
        qa, qw = self.qa, self.qw
        lane, warp = tid % 32, tid // 32
        g, c = lane // 4, lane % 4
        elem = self.element
        k32 = self.k // 32

        a_stage, w_stage = bm * tk * 2, tn * tk // 2
        base = cutlass.memory.SmemAllocator().allocate_array(Uint8, self.static.smem, byte_alignment=128)
        # Activations. Interleaved (block_m 16): 16-byte unit (g, p) of an m16 atom holds words
        # 2p, 2p + 1 of rows g and g + 8 as [g:2p, g+8:2p, g:2p+1, g+8:2p+1], exactly an MMA A
        # fragment, at unit p ^ g; filled by 4-byte cp.async, read by one ld.shared.v4 per MMA
        # step. Otherwise plain rows of 16-byte chunks (chunk q at q ^ (row % 8)), filled by
        # 16-byte cp.async, whose fragments take register moves. Both feed the MMAs the same
        # values, so the choice never changes a result bit.
        s_a32 = cute.make_tensor(
            cute.recast_ptr(base, dtype=Uint32), cute.make_layout((4, stages * bm * qa), stride=(1, 4))
        )
        s_a = s_a32
        if cutlass.const_expr(self.interleave):
            s_a = cute.make_tensor(
                cute.recast_ptr(base, dtype=Uint32),
                cute.make_layout((1, stages * bm * tk // 2), stride=(1, 1)),
            )
        w_base = base + stages * a_stage
        s_w = cute.make_tensor(w_base, cute.make_layout((16, stages * tn * qw), stride=(1, 16)))
        s_w32 = cute.make_tensor(
            cute.recast_ptr(w_base, dtype=Uint32), cute.make_layout((2, stages * tn * qw * 2), stride=(1, 2))
        )
        s_base = base + stages * (a_stage + w_stage)
        s_s = cute.make_tensor(
            cute.recast_ptr(s_base, dtype=elem), cute.make_layout((8, tn * self.srow // 8), stride=(1, 8))
        )
        s_s16 = cute.make_tensor(cute.recast_ptr(s_base, dtype=Uint16), cute.make_layout(tn * self.srow))
        s_se = cute.make_tensor(cute.recast_ptr(s_base, dtype=elem), cute.make_layout(tn * self.srow))

        words = cutlass.max(num_tokens, Int32(1)) * (self.k // 2)
        g_a = cute.make_tensor(
            cute.recast_ptr(a, dtype=Uint32), cute.make_layout((4, words // 4), stride=(1, 4))
        )
        atom_a = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
            Uint32,
            num_bits_per_copy=128,
        )
        if cutlass.const_expr(self.interleave):
            g_a = cute.make_tensor(
                cute.recast_ptr(a, dtype=Uint32), cute.make_layout((1, words), stride=(1, 1))
            )
            atom_a = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(), Uint32, num_bits_per_copy=32)
        g_w = cute.make_tensor(w, cute.make_layout((16, self.e_cap * self.n * k32), stride=(1, 16)))
        chunks = self.scale_chunks
        g_s = cute.make_tensor(scales, cute.make_layout((8, self.e_cap * self.n * chunks), stride=(1, 8)))
        atom_s = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
            elem,
            num_bits_per_copy=128,
        )
        mma = cute.make_mma_atom(cute.nvgpu.warp.MmaF16BF16Op(elem, Float32, (16, 8, 16)))

        # This thread's activation rows: gathered token offsets, and whether to load them at all.
        rows_per_pass = self.threads // qa
        ra = self.ra
        a_src = cute.make_rmem_tensor((ra,), Int32)
        a_ok = cute.make_rmem_tensor((ra,), Int32)
        for i in cutlass.range_constexpr(ra):
            r = tid // qa + i * rows_per_pass
            a_src[i] = 0
            a_ok[i] = 0
            if r < bm:
                route = sc[rows + r]
                if route >= 0:
                    a_src[i] = (route // self.topk) * (self.k // 2) + (tid % qa) * 4
                    a_ok[i] = 1
        row0 = expert * self.n + nt * tn
        w_src = row0 * k32

        # The block's scale slab, once, in the same commit group as k-tile 0.
        for i in range(tid, tn * chunks, self.threads):
            cute.copy(
                atom_s, g_s[None, row0 * chunks + i], s_s[None, (i // chunks) * (self.srow // 8) + i % chunks]
            )
        for s in cutlass.range_constexpr(stages - 1):
            self.issue(Int32(s), Int32(s), atom_a, g_a, s_a, a_src, a_ok, g_w, s_w, w_src, tid)
            cute.arch.cp_async_commit_group()

        acc = cute.make_rmem_tensor((4, self.ma, self.na), Float32)
        acc.fill(0.0)
        for kt in range(self.kt_count):
            cute.arch.cp_async_wait_group(stages - 2)
            cute.arch.sync_threads()
            nxt = kt + stages - 1
            if nxt < self.kt_count:
                self.issue(nxt, nxt % stages, atom_a, g_a, s_a, a_src, a_ok, g_w, s_w, w_src, tid)
            cute.arch.cp_async_commit_group()
            self.compute(kt, kt % stages, acc, s_a32, s_w32, (s_s16, s_se), mma, warp, g, c)

        # Epilogue: round once, store the two adjacent columns of each row this lane holds.
        half = cute.make_tensor(m_out.iterator, cute.make_layout((2, cute.size(m_out) // 2), stride=(1, 2)))
        y = cute.make_rmem_tensor((2,), self.output)
        for mi in cutlass.range_constexpr(self.ma):
            for h in cutlass.range_constexpr(2):
                route = sc[rows + mi * 16 + h * 8 + g]
                if route >= 0:
                    for at in cutlass.range_constexpr(self.na):
                        col = nt * tn + warp * self.nw + at * 8 + 2 * c
                        y[0] = acc[2 * h, mi, at].to(self.output)
                        y[1] = acc[2 * h + 1, mi, at].to(self.output)
                        cute.autovec_copy(y, half[None, (route * self.n + col) // 2])

    @cute.jit
    def compute(
        self, kt: Int32, slot: Int32, acc, s_a32, s_w32, scale_views, mma, warp: Int32, g: Int32, c: Int32
    ):
        """All MMAs of one k-tile for this warp, in ascending k."""
        bm, tn, qa = self.bm, self.tn, self.qa
        elem = self.element
        na, ma = self.na, self.ma
        s_s16, s_se = scale_views
        target = acc
        if cutlass.const_expr(self.fp32_scale):
            target = cute.make_rmem_tensor((4, ma, na), Float32)
            target.fill(0.0)
        for j in cutlass.range_constexpr(self.tk // 64):
            # Packed weights (16 nibbles = k in [16c, 16c + 16) of this 64-chunk) and scale pairs.
            wq = cute.make_rmem_tensor((2, na), Uint32)
            sp2 = cute.make_rmem_tensor((na,), Uint32)
            grp = (kt * self.tk + 64 * j + 16 * c) // self.group
            for at in cutlass.range_constexpr(na):
                nl = warp * self.nw + at * 8 + g
                cute.autovec_copy(
                    s_w32[None, slot * (tn * self.qw * 2) + j * (tn * 4) + nl * 4 + c], wq[None, at]
                )
                if cutlass.const_expr(not self.fp32_scale):
                    s = Uint32(s_s16[nl * self.srow + grp])
                    sp2[at] = s | (s << 16)
            units = self.tk // 4
            for sp in cutlass.range_constexpr(2):
                av = cute.make_rmem_tensor((4, 2, ma), Uint32)  # words, row half, m-atom
                if cutlass.const_expr(not self.interleave):
                    chunk = (8 * j + 2 * c + sp) ^ g
                    for mi in cutlass.range_constexpr(ma):
                        for h in cutlass.range_constexpr(2):
                            r = mi * 16 + h * 8 + g
                            cute.autovec_copy(s_a32[None, (slot * bm + r) * qa + chunk], av[None, h, mi])
                for t in cutlass.range_constexpr(2):
                    step = 2 * sp + t
                    afr = cute.make_rmem_tensor((4, ma), Uint32)
                    bfr = cute.make_rmem_tensor((2, na), Uint32)
                    for mi in cutlass.range_constexpr(ma):
                        if cutlass.const_expr(self.interleave):
                            unit = (
                                slot * (bm * units // 2)
                                + mi * (8 * units)
                                + g * units
                                + ((16 * j + 4 * c + step) ^ g)
                            )
                            cute.autovec_copy(s_a32[None, unit], afr[None, mi])
                        else:
                            afr[0, mi] = av[2 * t, 0, mi]
                            afr[1, mi] = av[2 * t, 1, mi]
                            afr[2, mi] = av[2 * t + 1, 0, mi]
                            afr[3, mi] = av[2 * t + 1, 1, mi]
                    for at in cutlass.range_constexpr(na):
                        x = wq[sp, at]
                        x4 = x >> 4
                        for e in cutlass.range_constexpr(2):
                            byte = 2 * t + e
                            sel = byte | (byte << 4) | ((byte + 4) << 8) | ((byte + 4) << 12)
                            v = (
                                _asm_u32(f"prmt.b32 $0, $1, $2, {sel};", x, x4) & Uint32(0x000F000F)
                            ) ^ Uint32(self.magic)
                            q = _asm_u32(
                                f"{self.fma} $0, $1, $2, $3;", v, Uint32(self.one), Uint32(self.bias)
                            )
                            if cutlass.const_expr(self.fp32_scale):
                                bfr[e, at] = q
                            else:
                                bfr[e, at] = _asm_u32(
                                    f"{self.fma} $0, $1, $2, $3;", q, sp2[at], Uint32(0x80008000)
                                )
                    a_op = cute.make_tensor(
                        cute.recast_ptr(afr.iterator, dtype=elem),
                        cute.make_layout((8, ma, 1), stride=(1, 8, 8 * ma)),
                    )
                    b_op = cute.make_tensor(
                        cute.recast_ptr(bfr.iterator, dtype=elem),
                        cute.make_layout((4, na, 1), stride=(1, 4, 4 * na)),
                    )
                    cute.gemm(mma, target, a_op, b_op, target)
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
