"""``quant.mxfp8``: MXFP8 activation quantization, E4M3 values with a UE8M0 scale per 32.

For each block of 32 consecutive elements of a row of ``x[M, K]`` (bf16 or fp16):

- ``amax`` is the largest ``|x|`` over the block's finite elements (0 when there are none).
- With ``amax = m * 2**E``, ``m`` in ``[1, 2)``, the scale exponent is ``e = E - 8`` for
  ``rounding="floor"`` (OCP MX v1.0) and ``e = E - 8 + (m > 1.75)`` for ``"ceil"`` (that is
  ``ceil(log2(amax / 448))``, DeepGEMM's convention), clamped to ``[-127, 127]``. An ``amax``
  of 0 gives ``e = -127``. ``scales[row, block] = e + 127``.
- ``q = e4m3(x * 2**-e)``, rounded to nearest even and saturated to +-448; +-Inf becomes
  +-448 and NaN stays NaN with its sign (``0x7F``/``0xFF``).

Scaling by a power of two is exact, so the result is exact: ``e`` comes from the integer
bits of the fp32 ``amax``, never from a log2. Every fp32 ``amax`` below ``2**-119`` (zero
and all fp32 subnormals, which bf16 inputs can produce) clamps to ``e = -127``, so the
scale byte is ``max(biased_exponent(amax) - 8 + ceil_bump, 0)``; the upper clamp cannot
bind for a finite fp32 ``amax``.

Each thread owns one 32-element block: four 16-byte loads, two 16-byte stores of E4M3 bytes
and one scale byte, no shared memory. Rows are contiguous, so the grid runs flat over the
``M * K / 32`` blocks, ``cdiv(num_rows * (K // 32), cta_threads)`` CTAs, rather than rows x
K-chunks: with ``K = 1536`` a row has only 48 blocks, which would leave most of a 128- or
256-thread CTA idle. Indices are 64-bit, so no product of ``M`` and ``K`` overflows.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint32

from ._base import AotKernel, dsl_dtype
from ._ptx import prmt

__all__ = ["Mxfp8Quant"]

BLOCK = 32  # elements per scale
ROUNDINGS = ("floor", "ceil")


class Mxfp8Quant(AotKernel):
    def __init__(self, geometry, static, *, dtype: str, K: int, rounding: str, cta_threads: int):
        super().__init__(geometry, static, dtype=dtype, K=K, rounding=rounding, cta_threads=cta_threads)
        if dtype not in ("bf16", "fp16"):
            raise ValueError(f"dtype must be bf16 or fp16 (got {dtype!r})")
        if K <= 0 or K % BLOCK:
            raise ValueError(f"K must be a positive multiple of {BLOCK} (got {K})")
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {', '.join(ROUNDINGS)} (got {rounding!r})")
        self.dtype = dsl_dtype(dtype)
        self.K = K
        self.ceil = rounding == "ceil"
        self.cta_threads = cta_threads
        self.blocks_per_row = K // BLOCK

    @cute.jit
    def __call__(
        self,
        q: cute.Pointer,
        scales: cute.Pointer,
        x: cute.Pointer,
        num_rows: Int32,
        stream: cuda.CUstream,
    ):
        self.kernel(q, scales, x, num_rows).launch(**self.launch_config(num_rows=num_rows), stream=stream)

    @cute.kernel
    def kernel(self, q: cute.Pointer, scales: cute.Pointer, x: cute.Pointer, num_rows: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        blk = Int64(bidx) * self.cta_threads + Int64(tidx)
        nblk = Int64(num_rows) * self.blocks_per_row
        if blk < nblk:
            m_x = self.vectors(x, BLOCK, nblk)
            m_q = self.vectors(q, BLOCK, nblk)
            m_s = self.tensor(scales, nblk)

            raw = cute.make_rmem_tensor((BLOCK,), self.dtype)
            cute.autovec_copy(m_x[None, blk], raw)
            words = raw.load().bitcast(Uint32)  # element 2i in the low half of word i
            vals = cute.make_rmem_tensor((BLOCK,), Float32)
            if cutlass.const_expr(self.dtype is cutlass.BFloat16):
                # bf16 -> fp32 is a 16-bit shift: do it on the words (subnormals stay exact).
                for i in cutlass.range_constexpr(BLOCK // 2):
                    vals[2 * i] = (words[i] << Uint32(16)).bitcast(Float32)
                    vals[2 * i + 1] = (words[i] & Uint32(0xFFFF0000)).bitcast(Float32)
            else:
                vals.store(raw.load().to(Float32))  # exact

            # amax over finite elements: v * 0 + v is v when finite and NaN otherwise, and
            # max.f32 ignores NaN operands. xorsign garbles the sign only.
            amax = Float32(0.0)
            for i in cutlass.range_constexpr(BLOCK):
                v = vals[i]
                amax = cute.arch.fmax(amax, v * Float32(0.0) + v, abs=True)
            bits = amax.bitcast(Uint32) & Uint32(0x7FFFFFFF)
            biased = Int32(bits >> Uint32(23))
            if cutlass.const_expr(self.ceil):
                # m > 1.75 <=> mantissa field > 0.75 * 2**23
                biased = biased + Int32((bits & Uint32(0x7FFFFF)) > Uint32(0x600000))
            byte = cutlass.max(biased - Int32(8), Int32(0))  # e + 127
            # 2**-e = 2**(127 - byte): biased exponent 254 - byte, always a normal fp32.
            inv = Uint32((Int32(254) - byte) << Int32(23)).bitcast(Float32)

            out = cute.make_rmem_tensor((BLOCK,), cutlass.Float8E4M3FN)
            out.store((vals.load() * inv).to(cutlass.Float8E4M3FN))
            out_words = cute.recast_tensor(out, Uint32)
            qw = out.load().bitcast(Uint32)
            for j in cutlass.range_constexpr(BLOCK // 4):
                # satfinite turns NaN into NaN, but neither the fp32 multiply nor the conversion
                # promises to keep a NaN's sign: put the input's sign bit back on every NaN byte.
                w = qw[j]
                signs = prmt(words[2 * j], words[2 * j + 1], 0x7531)  # high byte of each input
                nan = ((w & Uint32(0x7F7F7F7F)) + Uint32(0x01010101)) & Uint32(0x80808080)
                out_words[j] = (w & ~nan) | (signs & nan)
            cute.autovec_copy(out, m_q[None, blk])
            m_s[blk] = Uint8(byte)
