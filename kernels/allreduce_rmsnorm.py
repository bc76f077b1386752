"""``comm.allreduce_rmsnorm``: all-reduce, residual add and RMSNorm of ``rows`` rows, one launch.

For each row of ``hidden`` bf16/fp16 elements, every element ``i``, with ``x_r`` rank ``r``'s
``inp`` and all arithmetic fp32 instructions with one rounding each (inline PTX, so nothing
reassociates or fuses them)::

    s     = ((x_0 + x_1) + x_2) + ... + x_{W-1}       add.rn.f32, rank order (as comm.allreduce)
    y     = s + float(residual)                         add.rn.f32
    residual_out = round(y)                             cvt.rn into the dtype
    q_t   = sum of y*y over thread t's elements         mul.rn.f32, then add.rn.f32, from 0.0, in
                                                        the order pack j = 0.., element 0..7
    q_w   = butterfly over the warp's 32 q_t            q += shfl.bfly(q, k), k = 16, 8, 4, 2, 1
    total = ((q_w0 + q_w1) + ...) + q_w{n-1}            warps in index order
    rstd  = rsqrt.approx(total / hidden + eps)          div.rn.f32, add.rn.f32
    out   = round((y * rstd) * float(gamma))            mul.rn.f32 twice, rounded once

Thread ``t`` of a CTA of ``hidden / (8 * packs_per_thread)`` threads owns packs (8 elements)
``t + j * threads`` of its row, ``j < packs_per_thread``; the butterfly leaves every lane with
the same bits (fp32 adds commute exactly). ``y`` never leaves registers before its rounding.
Every rank computes every row from the same bits in the same order, so ``out`` and
``residual_out`` are bit-identical on every rank. ``eps`` is a runtime fp32 argument.

Transport and synchronisation are ``comm.allreduce``'s one-shot pull (this class reuses its
barrier, call counter and copy): CTA ``row`` stages its row of ``inp`` in its window's slot 0,
meets CTA ``row`` of every rank at barrier 0, then reads the row from every rank's slot 0 (its
own ``inp`` for itself). ``residual`` may be ``residual_out`` and ``inp`` may be ``out``: a thread
reads each of its packs before it writes there. The runtime guarantees ``1 <= rows <= 64`` (the
window's flag rows) and ``rows * hidden <= capacity``; a CTA past capacity only meets the barrier.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from b12x_aot.comm.layout import MAX_WORLD, PACK_BYTES

from ._base import AotKernel, dsl_dtype
from ._ptx import (
    add_rn_f32,
    div_rn_f32,
    ld_cg_v4,
    mul_rn_f32,
    rsqrt_approx_f32,
    st_v4,
)
from .allreduce import DTYPES, AllReduce, _Call

__all__ = ["AllReduceRMSNorm"]

HIDDENS = (2048, 3584, 4096, 7168)
PACKS_PER_THREAD = (1, 2)
WARP = 32


class AllReduceRMSNorm(AllReduce):
    """One CTA per row; the reduced row stays in fp32 registers until its single rounding."""

    def __init__(self, geometry, static, *, dtype: str, hidden: int, world: int, packs_per_thread: int):
        AotKernel.__init__(
            self, geometry, static, dtype=dtype, hidden=hidden, world=world, packs_per_thread=packs_per_thread
        )
        for name, value, allowed in (
            ("dtype", dtype, DTYPES),
            ("hidden", hidden, HIDDENS),
            ("world", world, tuple(range(2, MAX_WORLD + 1))),
            ("packs_per_thread", packs_per_thread, PACKS_PER_THREAD),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))} (got {value!r})")
        self.element = dsl_dtype(dtype)
        self.world = world
        self.pull, self.twoshot = True, False
        self.pack_elements = PACK_BYTES // (self.element.width // 8)
        self.hidden = hidden
        self.per_thread = packs_per_thread
        self.cta_threads = hidden // (self.pack_elements * packs_per_thread)
        self.warps = self.cta_threads // WARP

    @cute.jit
    def __call__(
        self,
        out: cute.Pointer,
        residual_out: cute.Pointer,
        inp: cute.Pointer,
        residual: cute.Pointer,
        gamma: cute.Pointer,
        peers: cute.Pointer,
        ctrl: cute.Pointer,
        rank: Int32,
        rows: Int32,
        capacity: Int32,
        eps: Float32,
        stream: cuda.CUstream,
    ):
        rows_in = (out, residual_out, inp, residual, gamma)  # the kernel takes the row tensors as one
        self.kernel(rows_in, peers, ctrl, rank, rows, capacity, eps).launch(
            **self.launch_config(rank=rank, rows=rows, capacity=capacity),
            min_blocks_per_mp=1,
            stream=stream,
        )

    @cute.kernel
    def kernel(self, tensors: tuple, peers: cute.Pointer, ctrl: cute.Pointer, rank, rows, capacity, eps):
        out, residual_out, inp, residual, gamma = tensors
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        partials = cutlass.utils.SmemAllocator().allocate_array(Float32, self.warps, byte_alignment=16)
        call = _Call.start(self.world, self.element.width // 8, peers, ctrl, rank, capacity)
        row_packs = self.hidden // self.pack_elements
        start = row * row_packs
        inside = Int32(row + 1) * self.hidden <= capacity
        if inside:
            self.copy(inp.toint(), [call.slot(call.own, 0)], None, start, start + row_packs, tid)
        if self.barrier(0, call, tid, row) == 0 and inside:  # the barrier first: every CTA meets it
            addresses = (out.toint(), residual_out.toint(), inp.toint(), residual.toint(), gamma.toint())
            self.normalize(call, addresses, start, tid, self.tensor(partials, self.warps), eps)
        self.advance_calls(call, tid, grid)

    @cute.jit
    def normalize(self, call: _Call, addresses: tuple, start: Int32, tid: Int32, partials: cute.Tensor, eps):
        """This thread's packs of the row: reduce, add the residual, write ``residual_out``,
        then scale by the row's rstd and ``gamma`` into ``out`` (the module docstring's order)."""
        out, residual_out, inp, residual, gamma = addresses
        srcs = self.sources(call, inp)
        offsets = [Int64(start + tid + j * self.cta_threads) * PACK_BYTES for j in range(self.per_thread)]
        ys = []
        q = Float32(0.0)
        for off in offsets:
            res = self.widen(ld_cg_v4(residual + off))
            y = [add_rn_f32(s, r) for s, r in zip(self.sum_f32(srcs, off), res, strict=True)]
            st_v4(residual_out + off, self.narrow(y))
            for v in y:
                q = add_rn_f32(q, mul_rn_f32(v, v))
            ys.append(y)
        for k in (16, 8, 4, 2, 1):
            q = add_rn_f32(q, cute.arch.shuffle_sync_bfly(q, offset=k))
        if tid % WARP == 0:
            partials[tid // WARP] = q
        cute.arch.sync_threads()
        total = partials[0]
        for w in range(1, self.warps):
            total = add_rn_f32(total, partials[w])
        rstd = rsqrt_approx_f32(add_rn_f32(div_rn_f32(total, Float32(self.hidden)), eps))
        for i, off in enumerate(offsets):
            g = self.widen(ld_cg_v4(gamma + (off - Int64(start) * PACK_BYTES)))
            st_v4(
                out + off,
                self.narrow([mul_rn_f32(mul_rn_f32(y, rstd), w) for y, w in zip(ys[i], g, strict=True)]),
            )
