"""An Ampere-style tensor-op GEMM: ``C = A @ B^T`` with ``cp.async``, ``ldmatrix`` and ``mma.sync``.

A is ``(m, k)`` and B ``(n, k)``, both K-major (their last mode contiguous), C is ``(m, n)``
N-major; fp16 or bf16 operands, an fp32 (or fp16) accumulator, C in any float type. Each CTA
computes one ``tile_m x tile_n`` tile of C over a ring of ``stages`` shared-memory k-tiles:

- gmem -> smem: every thread copies 16-byte chunks with ``cp.async``; a chunk outside the
  matrix (a partial last tile in m, n or k) is written as zeros instead, so the MMAs add
  nothing for it. That needs k to be a multiple of 8 (16 bytes), which the spec declares.
- smem -> registers: ``ldmatrix`` through a swizzled layout (no bank conflicts), the k-blocks
  of a k-tile one after the other;
- registers: a tiled ``mma.sync`` (16x8x16 atoms in a ``warp_layout_mnk`` grid of warps);
- epilogue: the accumulator converted once to C's type and stored, element by element,
  where it lies inside C.

At k-tile t the CTA waits for tile t, makes every warp pass a barrier (so all are done with
tile t-1), starts the copy of tile t + stages - 1 into the slot tile t-1 used, and computes t.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator

__all__ = ["TensorOpGemm"]

_MMA_SHAPE = (16, 8, 16)
_CHUNK_BITS = 128  # one cp.async: 16 bytes


class TensorOpGemm:
    def __init__(
        self,
        acc_dtype: type = cutlass.Float32,
        tile_shape_mnk: tuple[int, int, int] = (128, 128, 32),
        warp_layout_mnk: tuple[int, int, int] = (2, 2, 1),
        stages: int = 3,
    ) -> None:
        tile_m, tile_n, tile_k = tile_shape_mnk
        warps_m, warps_n, warps_k = warp_layout_mnk
        if warps_k != 1:
            raise ValueError(f"warp_layout_mnk must split only m and n (got {warp_layout_mnk})")
        if tile_m % (warps_m * _MMA_SHAPE[0]) or tile_n % (warps_n * _MMA_SHAPE[1] * 2):
            raise ValueError(
                f"tile {tile_shape_mnk} does not divide into {warp_layout_mnk} warps of MMA atoms"
            )
        if tile_k % _MMA_SHAPE[2] or stages < 2:
            raise ValueError(f"tile_k must be a multiple of 16 and stages >= 2 (got {tile_k}, {stages})")
        self.acc_dtype = acc_dtype
        self.tile = tile_shape_mnk
        self.warps = warp_layout_mnk
        self.stages = stages
        self.threads = warps_m * warps_n * 32

    # --- layouts and atoms, built while tracing the host function -------------------------

    def _smem_layout(self, dtype: type, rows: int) -> tuple[cute.Layout, cute.Swizzle]:
        """A K-major ``(rows, tile_k, stages)`` ring of 8-row atoms, swizzled for ldmatrix."""
        tile_k = self.tile[2]
        row_elems = min(tile_k, 1024 // dtype.width)  # at most 128 bytes of a row per atom
        chunk_elems = _CHUNK_BITS // dtype.width
        bits = min(int(math.log2(row_elems // chunk_elems)), 3)
        swizzle = cute.make_swizzle(bits, int(math.log2(_CHUNK_BITS // 8)), int(math.log2(chunk_elems)))
        atom = cute.make_layout((8, row_elems), stride=(row_elems, 1))
        return cute.tile_to_shape(atom, (rows, tile_k, self.stages), (0, 1, 2)), swizzle

    def _gmem_copy(self, dtype: type) -> cute.TiledCopy:
        """16-byte cp.async chunks; consecutive threads take consecutive chunks of a row."""
        chunk_elems = _CHUNK_BITS // dtype.width
        per_row = self.tile[2] // chunk_elems
        atom = cute.make_copy_atom(
            cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
            dtype,
            num_bits_per_copy=_CHUNK_BITS,
        )
        threads = cute.make_layout((self.threads // per_row, per_row), stride=(per_row, 1))
        return cute.make_tiled_copy_tv(atom, threads, cute.make_layout((1, chunk_elems)))

    def _tiled_mma(self, dtype: type) -> cute.TiledMma:
        warps_m, warps_n, _ = self.warps
        op = cute.nvgpu.warp.MmaF16BF16Op(dtype, self.acc_dtype, _MMA_SHAPE)
        # twice the atom's n per warp, so one ldmatrix.x4 fills B for two atoms
        tile = (warps_m * _MMA_SHAPE[0], warps_n * _MMA_SHAPE[1] * 2, _MMA_SHAPE[2])
        return cute.make_tiled_mma(op, cute.make_layout(self.warps), permutation_mnk=tile)

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream: cuda.CUstream):
        sA_layout, sA_swizzle = self._smem_layout(mA.element_type, self.tile[0])
        sB_layout, sB_swizzle = self._smem_layout(mB.element_type, self.tile[1])
        tiles = cute.ceil_div(mC.shape, (self.tile[0], self.tile[1]))
        self.kernel(
            mA,
            mB,
            mC,
            sA_layout,
            sA_swizzle,
            sB_layout,
            sB_swizzle,
            self._gmem_copy(mA.element_type),
            self._gmem_copy(mB.element_type),
            self._tiled_mma(mA.element_type),
        ).launch(
            grid=[cute.size(tiles[0]), cute.size(tiles[1]), 1], block=[self.threads, 1, 1], stream=stream
        )

    # --- the kernel -----------------------------------------------------------------------

    @cute.jit
    def _load(self, copy, src, dst, coords, shape, k_tile, slot):
        """Copy one k-tile of an operand into ``slot``; chunks outside the matrix become 0."""
        for i in cutlass.range_constexpr(cute.size(src, mode=[1])):
            for j in cutlass.range_constexpr(cute.size(src, mode=[2])):
                if cute.elem_less(coords[0, i, j, k_tile], shape):
                    cute.copy(copy, src[None, i, j, k_tile], dst[None, i, j, slot])
                else:
                    dst[None, i, j, slot].fill(0)

    @cute.kernel
    def kernel(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        sA_layout: cute.Layout,
        sA_swizzle: cute.Swizzle,
        sB_layout: cute.Layout,
        sB_swizzle: cute.Swizzle,
        copy_A: cute.TiledCopy,
        copy_B: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bm, bn, _ = cute.arch.block_idx()
        tile_m, tile_n, tile_k = self.tile

        @cute.struct
        class Storage:
            a: cute.struct.Align[cute.struct.MemRange[mA.element_type, cute.cosize(sA_layout)], 128]
            b: cute.struct.Align[cute.struct.MemRange[mB.element_type, cute.cosize(sB_layout)], 128]

        storage = SmemAllocator().allocate(Storage)
        sA = storage.a.get_tensor(sA_layout, swizzle=sA_swizzle)
        sB = storage.b.get_tensor(sB_layout, swizzle=sB_swizzle)

        # this CTA's rows of A and B, as k-tiles: (tile, tile_k, k_tiles), and their coordinates
        gA = cute.local_tile(mA, (tile_m, tile_k), (bm, None))
        gB = cute.local_tile(mB, (tile_n, tile_k), (bn, None))
        cA = cute.local_tile(cute.make_identity_tensor(mA.shape), (tile_m, tile_k), (bm, None))
        cB = cute.local_tile(cute.make_identity_tensor(mB.shape), (tile_n, tile_k), (bn, None))
        k_tiles = cute.size(gA, mode=[2])

        thr_A, thr_B = copy_A.get_slice(tidx), copy_B.get_slice(tidx)
        tAgA, tAsA, tAcA = thr_A.partition_S(gA), thr_A.partition_D(sA), thr_A.partition_S(cA)
        tBgB, tBsB, tBcB = thr_B.partition_S(gB), thr_B.partition_D(sB), thr_B.partition_S(cB)

        for s in cutlass.range_constexpr(self.stages - 1):
            if s < k_tiles:
                self._load(copy_A, tAgA, tAsA, tAcA, mA.shape, s, s)
                self._load(copy_B, tBgB, tBsB, tBcB, mB.shape, s, s)
            cute.arch.cp_async_commit_group()

        thr_mma = tiled_mma.get_slice(tidx)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA)[None, None, None, 0])
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB)[None, None, None, 0])
        gC = cute.local_tile(mC, (tile_m, tile_n), (bm, bn))
        acc = tiled_mma.make_fragment_C(thr_mma.partition_C(gC))
        acc.fill(0.0)

        ldmatrix = cute.nvgpu.warp.LdMatrix8x8x16bOp(False, 4)
        s2r_A = cute.make_tiled_copy_A(cute.make_copy_atom(ldmatrix, mA.element_type), tiled_mma).get_slice(
            tidx
        )
        s2r_B = cute.make_tiled_copy_B(cute.make_copy_atom(ldmatrix, mB.element_type), tiled_mma).get_slice(
            tidx
        )
        tXsA, tXrA = s2r_A.partition_S(sA), s2r_A.retile(tCrA)
        tXsB, tXrB = s2r_B.partition_S(sB), s2r_B.retile(tCrB)

        for k_tile in range(k_tiles):
            cute.arch.cp_async_wait_group(self.stages - 2)
            cute.arch.sync_threads()
            ahead = k_tile + self.stages - 1
            if ahead < k_tiles:
                self._load(copy_A, tAgA, tAsA, tAcA, mA.shape, ahead, ahead % self.stages)
                self._load(copy_B, tBgB, tBsB, tBcB, mB.shape, ahead, ahead % self.stages)
            cute.arch.cp_async_commit_group()
            slot = k_tile % self.stages
            for k_block in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.copy(s2r_A, tXsA[None, None, k_block, slot], tXrA[None, None, k_block])
                cute.copy(s2r_B, tXsB[None, None, k_block, slot], tXrB[None, None, k_block])
                cute.gemm(tiled_mma, acc, tCrA[None, None, k_block], tCrB[None, None, k_block], acc)
        cute.arch.cp_async_wait_group(0)

        tCgC = thr_mma.partition_C(gC)
        tCcC = thr_mma.partition_C(
            cute.local_tile(cute.make_identity_tensor(mC.shape), (tile_m, tile_n), (bm, bn))
        )
        out = cute.make_fragment_like(acc, mC.element_type)
        out.store(acc.load().to(mC.element_type))
        for i in cutlass.range_constexpr(cute.size(out)):
            if cute.elem_less(tCcC[i], mC.shape):
                tCgC[i] = out[i]
