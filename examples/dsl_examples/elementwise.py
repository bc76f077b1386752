"""Elementwise ``c = op(a, b)`` over 2-D tensors of any shape and any strides.

The host function tiles each tensor with the CTA's thread-value layout (``zipped_divide``):
every CTA takes one ``(rows, cols)`` tile, each thread ``values`` consecutive columns of one
row. A coordinate tensor tiled the same way marks the elements inside the tensor, so a
partial last tile (any ``m``, ``n``) reads and writes nothing outside. With strides only known
at run time, every element is its own load: the kernel is general, not vectorized.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

__all__ = ["ElementwiseBinary"]

_OPS = ("add", "sub", "mul")


class ElementwiseBinary:
    """``c = a <op> b`` in the tensors' element type; ``op`` is one of add, sub, mul."""

    def __init__(self, op: str = "add", threads: int = 128, values: int = 4) -> None:
        if op not in _OPS:
            raise ValueError(f"op must be one of {_OPS} (got {op!r})")
        if threads % 32:
            raise ValueError(f"threads must be a multiple of 32 (got {threads})")
        self.op = op
        self.threads = threads
        self.values = values

    def _apply(self, x: cute.TensorSSA, y: cute.TensorSSA) -> cute.TensorSSA:
        if cutlass.const_expr(self.op == "add"):
            return x + y
        if cutlass.const_expr(self.op == "sub"):
            return x - y
        return x * y

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream: cuda.CUstream):
        # threads in (warps, 32) rows of the tile, each with `values` consecutive columns
        thr_layout = cute.make_ordered_layout((self.threads // 32, 32), order=(1, 0))
        val_layout = cute.make_ordered_layout((1, self.values), order=(1, 0))
        tiler, tv_layout = cute.make_layout_tv(thr_layout, val_layout)
        tiles = [cute.zipped_divide(t, tiler) for t in (mA, mB, mC)]  # ((rows, cols), (tiles_m, tiles_n))
        coords = cute.zipped_divide(cute.make_identity_tensor(mC.shape), tiler)
        self.kernel(*tiles, coords, mC.shape, thr_layout, val_layout).launch(
            grid=[cute.size(tiles[2], mode=[1]), 1, 1],
            block=[cute.size(tv_layout, mode=[0]), 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        gA: cute.Tensor,
        gB: cute.Tensor,
        gC: cute.Tensor,
        cC: cute.Tensor,
        shape: cute.Shape,
        thr_layout: cute.Layout,
        val_layout: cute.Layout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        tile = ((None, None), bidx)
        load = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), gA.element_type)
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), gC.element_type)
        thread = cute.make_tiled_copy_tv(load, thr_layout, val_layout).get_slice(tidx)
        tA, tB, tC = (thread.partition_S(g[tile]) for g in (gA, gB, gC))
        tCoord = thread.partition_S(cC[tile])
        inside = cute.make_rmem_tensor(tCoord.shape, cutlass.Boolean)
        for i in cutlass.range_constexpr(cute.size(inside)):
            inside[i] = cute.elem_less(tCoord[i], shape)
        rA, rB, rC = cute.make_fragment_like(tA), cute.make_fragment_like(tB), cute.make_fragment_like(tC)
        cute.copy(load, tA, rA, pred=inside)
        cute.copy(load, tB, rB, pred=inside)
        rC.store(self._apply(rA.load(), rB.load()))
        cute.copy(store, rC, tC, pred=inside)
