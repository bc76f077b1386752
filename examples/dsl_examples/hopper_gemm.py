"""A Hopper (sm_90a) GEMM: ``C = A @ B^T`` with TMA, mbarrier pipelines, wgmma and a TMA store.

A is ``(m, k)`` and B ``(n, k)``, both K-major; C is ``(m, n)`` N-major (row-major). A and B are
both fp16 or both bf16, the accumulator is fp32, C is fp16, bf16 or fp32. m, n and k are
runtime values and need not be tile multiples: TMA fills the parts of a load box outside A or B
with zeros (so they add nothing) and clips the parts of the store box outside C. TMA does need
16-byte aligned base pointers and row strides: k a multiple of 8, n a multiple of 8 (16-bit C)
or 4 (fp32 C); m and n at least 1 (an empty grid does not launch), k may be 0 (C = 0).

Each CTA owns one ``tile_m x tile_n`` tile of C and has three roles, by warp:

- warps 0-7, two *consumer* warpgroups: each multiplies a ``tile_m / 2``-row half of the tile
  with wgmma straight from shared memory, keeping one k-tile of wgmma in flight;
- warp 8, the *producer*: issues the TMA loads of A and B k-tiles into a ring of ``stages``
  shared-memory slots, each guarded by a "full" and an "empty" mbarrier (``PipelineTmaAsync``);
- after the k loop the consumers convert the accumulator to C's type, write the whole tile to
  its own shared-memory buffer, and one thread stores it with TMA (a bulk store per 128-byte
  wide column band of the tile).

The CTAs of a cluster ``(cluster_m, cluster_n, 1)`` that share a row of tiles need the same A
k-tile, those that share a column the same B k-tile: each loads its slice of the shared tile and
multicasts it to all of them. A producer thus writes into its peers' slots too, so its empty
barrier waits for the consumers of every CTA it writes into (each of their consumer warps arrives
once), and no CTA leaves before the whole cluster is done with the others' barriers and memory.

Launch: ``block = (288, 1, 1)``, ``cluster = (cluster_m, cluster_n, 1)`` and

    grid = (cluster_m * ceil(m / (tile_m * cluster_m)), cluster_n * ceil(n / (tile_n * cluster_n)), 1)

i.e. the tile counts ``ceil(m / tile_m)`` and ``ceil(n / tile_n)`` rounded up to whole clusters;
a CTA of the rounding whose tile lies wholly outside C still loads its share for its cluster and
stores nothing. With the defaults (128x128x64 tiles, a 2x1 cluster) that is
``(2 * ceil(m / 256), ceil(n / 128), 1)``; B is multicast across the two CTAs, A is not.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

__all__ = ["HopperGemm"]

_CONSUMER_WARPGROUPS = 2
_WARPGROUP_THREADS = 128
_PRODUCER_WARP = _CONSUMER_WARPGROUPS * _WARPGROUP_THREADS // 32  # the warp after the consumers
_THREADS = _CONSUMER_WARPGROUPS * _WARPGROUP_THREADS + 32
_EPILOGUE_BARRIER = 1  # named barrier over the consumer threads (0 is __syncthreads)
_SWIZZLE_ALIGN = 1024  # a 128-byte swizzle pattern repeats every 1024 bytes
_SMEM_CAPACITY = 227 * 1024  # sm_90's opt-in dynamic shared memory per block


class HopperGemm:
    """``C = A @ B^T`` on sm_90a; see the module docstring for the layouts, roles and grid:
    ``grid = (cluster_m * ceil(m / (tile_m * cluster_m)), cluster_n * ceil(n / (tile_n * cluster_n)), 1)``,
    ``block = (288, 1, 1)``, ``cluster = cluster_shape_mnk``."""

    def __init__(
        self,
        acc_dtype: type = cutlass.Float32,
        tile_shape_mnk: tuple[int, int, int] = (128, 128, 64),
        cluster_shape_mnk: tuple[int, int, int] = (2, 1, 1),
        stages: int = 4,
    ) -> None:
        tile_m, tile_n, tile_k = tile_shape_mnk
        cluster_m, cluster_n, cluster_k = cluster_shape_mnk
        if acc_dtype is not cutlass.Float32:
            raise ValueError(f"acc_dtype must be Float32 (got {acc_dtype})")
        if tile_m != 64 * _CONSUMER_WARPGROUPS or tile_n % 16 or not 16 <= tile_n <= 256:
            raise ValueError(
                f"tile_shape_mnk needs tile_m = 128 and tile_n a multiple of 16 in 16..256 (got {tile_shape_mnk})"
            )
        if tile_k != 64:
            raise ValueError(f"tile_k must be 64, one 128-byte swizzle row of 16-bit data (got {tile_k})")
        if cluster_k != 1 or cluster_m not in (1, 2) or cluster_n not in (1, 2):
            raise ValueError(f"cluster_shape_mnk must be (1 or 2, 1 or 2, 1) (got {cluster_shape_mnk})")
        if stages < 2:
            raise ValueError(f"stages must be at least 2 (got {stages})")
        self.acc_dtype = acc_dtype
        self.tile = tile_shape_mnk
        self.cluster = cluster_shape_mnk
        self.stages = stages
        self.threads = _THREADS

    # --- layouts and atoms, built while tracing the host function -------------------------

    def _tiled_mma(self, dtype: type) -> cute.TiledMma:
        """One 64 x tile_n wgmma atom per consumer warpgroup, stacked along m."""
        return sm90.make_trivial_tiled_mma(
            dtype,
            dtype,
            cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.K,
            self.acc_dtype,
            (_CONSUMER_WARPGROUPS, 1, 1),
            tiler_mn=(64, self.tile[1]),
        )

    def _load_atom(
        self, tensor: cute.Tensor, smem_layout: cute.ComposedLayout, rows: int, sharers: int
    ) -> tuple[cute.CopyAtom, cute.Tensor]:
        """A TMA load of one ``(rows, tile_k)`` k-tile; multicast when ``sharers`` CTAs need it."""
        op = cpasync.CopyBulkTensorTileG2SMulticastOp() if sharers > 1 else cpasync.CopyBulkTensorTileG2SOp()
        one_stage = cute.slice_(smem_layout, (None, None, 0))
        return cpasync.make_tiled_tma_atom(op, tensor, one_stage, (rows, self.tile[2]), num_multicast=sharers)

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        if cutlass.const_expr(a.element_type not in (cutlass.Float16, cutlass.BFloat16)):
            raise TypeError(f"A must be Float16 or BFloat16 (got {a.element_type})")
        if cutlass.const_expr(b.element_type is not a.element_type):
            raise TypeError(f"A and B must have one type (got {a.element_type}, {b.element_type})")
        tile_m, tile_n, _ = self.tile
        cluster_m, cluster_n, _ = self.cluster
        # every operand is "row-major" in the helpers' terms: A, B K-major, C N-major
        sA_layout = sm90.make_smem_layout_a(LayoutEnum.ROW_MAJOR, self.tile, a.element_type, self.stages)
        sB_layout = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, self.tile, b.element_type, self.stages)
        sC_layout = sm90.make_smem_layout_epi(c.element_type, LayoutEnum.ROW_MAJOR, (tile_m, tile_n), 1)
        sC_layout = cute.slice_(sC_layout, (None, None, 0))

        # A is shared along a cluster row (cluster_n CTAs), B along a cluster column
        tma_a, tma_tensor_a = self._load_atom(a, sA_layout, tile_m, cluster_n)
        tma_b, tma_tensor_b = self._load_atom(b, sB_layout, tile_n, cluster_m)
        tma_c, tma_tensor_c = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), c, sC_layout, (tile_m, tile_n)
        )

        Align, Buffer = cute.struct.Align, cute.struct.MemRange

        @cute.struct
        class SharedStorage:
            barriers: Buffer[cutlass.Int64, 2 * self.stages]  # full[stages], then empty[stages]
            sA: Align[Buffer[a.element_type, cute.cosize(sA_layout)], _SWIZZLE_ALIGN]
            sB: Align[Buffer[b.element_type, cute.cosize(sB_layout)], _SWIZZLE_ALIGN]
            sC: Align[Buffer[c.element_type, cute.cosize(sC_layout)], _SWIZZLE_ALIGN]

        if cutlass.const_expr(SharedStorage.size_in_bytes() > _SMEM_CAPACITY):
            raise ValueError(
                f"{SharedStorage.size_in_bytes()} bytes of shared memory exceed {_SMEM_CAPACITY}: use fewer stages"
            )
        self.shared_storage = SharedStorage
        m, n = c.shape
        grid_m = cluster_m * ((m + tile_m * cluster_m - 1) // (tile_m * cluster_m))
        grid_n = cluster_n * ((n + tile_n * cluster_n - 1) // (tile_n * cluster_n))
        self.kernel(
            tma_a,
            tma_tensor_a,
            tma_b,
            tma_tensor_b,
            tma_c,
            tma_tensor_c,
            sA_layout,
            sB_layout,
            sC_layout,
        ).launch(
            grid=[grid_m, grid_n, 1],
            block=[self.threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            cluster=[cluster_m, cluster_n, 1],
            stream=stream,
        )

    # --- the kernel -----------------------------------------------------------------------

    @cute.kernel
    def kernel(
        self,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_c: cute.CopyAtom,
        mC: cute.Tensor,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        sC_layout: cute.ComposedLayout,
    ):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == _PRODUCER_WARP:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)
            cpasync.prefetch_descriptor(tma_c)

        storage = SmemAllocator().allocate(self.shared_storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
        pipe = self._make_pipeline(storage.barriers.data_ptr(), sA_layout, sB_layout, sA.element_type)

        bm, bn, _ = cute.arch.block_idx()
        tile_m, tile_n, tile_k = self.tile
        gA = cute.local_tile(mA, (tile_m, tile_k), (bm, None))  # (tile_m, tile_k, k_tiles)
        gB = cute.local_tile(mB, (tile_n, tile_k), (bn, None))  # (tile_n, tile_k, k_tiles)
        gC = cute.local_tile(mC, (tile_m, tile_n), (bm, bn))
        k_tiles = cute.size(gA, mode=[2])

        if warp == _PRODUCER_WARP:
            self._produce(pipe, tma_a, tma_b, sA, sB, gA, gB, k_tiles)
        else:
            # built here, not passed in: a launch argument would carry its ACCUMULATE flag
            tiled_mma = self._tiled_mma(sA.element_type)
            acc = self._consume(pipe, tiled_mma, sA, sB, k_tiles)
            self._store(tiled_mma, tma_c, acc, sC, gC, sC.element_type, warp)

        if cutlass.const_expr(self.cluster[0] * self.cluster[1] > 1):
            # peers arrive on our empty barriers and multicast into our smem until they finish
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    def _cluster_layout(self) -> cute.Layout:
        """CTAs of a cluster as (v, m, n, k), the rank order of ``block_idx_in_cluster``."""
        return cute.make_layout((1, self.cluster[0], self.cluster[1], 1))

    def _make_pipeline(
        self,
        barriers: cute.Pointer,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
        dtype: type,
    ) -> pipeline.PipelineTmaAsync:
        """The k-tile ring: "full" completes when a slot's bytes have all landed (whoever sent
        them), "empty" when the consumer warps of every CTA our producer writes into are done."""
        cluster_m, cluster_n, _ = self.cluster
        stage_bytes = cute.size_in_bytes(dtype, cute.slice_(sA_layout, (None, None, 0))) + cute.size_in_bytes(
            dtype, cute.slice_(sB_layout, (None, None, 0))
        )
        sharers = cluster_m + cluster_n - 1  # this CTA, its cluster row and its cluster column
        consumer_warps = _CONSUMER_WARPGROUPS * _WARPGROUP_THREADS // 32
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers,
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, sharers * consumer_warps),
            tx_count=stage_bytes,
            cta_layout_vmnk=self._cluster_layout(),
        )

    @cute.jit
    def _produce(
        self,
        pipe: pipeline.PipelineTmaAsync,
        tma_a: cute.CopyAtom,
        tma_b: cute.CopyAtom,
        sA: cute.Tensor,
        sB: cute.Tensor,
        gA: cute.Tensor,
        gB: cute.Tensor,
        k_tiles: cutlass.Int32,
    ) -> None:
        """Warp 8: load k-tile after k-tile into the ring, each once its slot is free everywhere."""
        layout = self._cluster_layout()
        coord = layout.get_flat_coord(cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster()))
        cluster_m, cluster_n, _ = self.cluster
        # each CTA loads a 1/cluster_n slice of A and a 1/cluster_m slice of B for all sharers
        tAsA, tAgA = cpasync.tma_partition(
            tma_a,
            coord[2],
            cute.make_layout(cluster_n),
            cute.group_modes(sA, 0, 2),
            cute.group_modes(gA, 0, 2),
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_b,
            coord[1],
            cute.make_layout(cluster_m),
            cute.group_modes(sB, 0, 2),
            cute.group_modes(gB, 0, 2),
        )
        a_cast, b_cast = {}, {}
        if cutlass.const_expr(cluster_n > 1):  # the CTAs of this cluster row: same m, any n
            a_cast["mcast_mask"] = cpasync.create_tma_multicast_mask(layout, coord, mcast_mode=2)
        if cutlass.const_expr(cluster_m > 1):  # the CTAs of this cluster column: same n, any m
            b_cast["mcast_mask"] = cpasync.create_tma_multicast_mask(layout, coord, mcast_mode=1)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for _ in cutlass.range(k_tiles, unroll=1):
            pipe.producer_acquire(state)  # waits for "empty", then arms "full" with the stage's bytes
            full = pipe.producer_get_barrier(state)
            cute.copy(tma_a, tAgA[None, state.count], tAsA[None, state.index], tma_bar_ptr=full, **a_cast)
            cute.copy(tma_b, tBgB[None, state.count], tBsB[None, state.index], tma_bar_ptr=full, **b_cast)
            pipe.producer_commit(state)
            state.advance()

    @cute.jit
    def _consume(
        self,
        pipe: pipeline.PipelineTmaAsync,
        tiled_mma: cute.TiledMma,
        sA: cute.Tensor,
        sB: cute.Tensor,
        k_tiles: cutlass.Int32,
    ) -> cute.Tensor:
        """Warps 0-7: accumulate the tile over all k-tiles; returns the fp32 accumulator."""
        tidx, _, _ = cute.arch.thread_idx()
        # wgmma reads smem through warpgroup-wide descriptors: slice at the warpgroup's first thread
        first = (tidx // _WARPGROUP_THREADS) * _WARPGROUP_THREADS
        thr_mma = tiled_mma.get_slice(first)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))  # (mma, mma_m, k_blocks, stages)
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.tile[0], self.tile[1])), self.acc_dtype)
        # zeroed once and always accumulated: no first-k-tile special case, and k = 0 gives C = 0
        acc.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for k_tile in cutlass.range(k_tiles, unroll=1):
            pipe.consumer_wait(read)
            warpgroup.fence()  # the accumulator registers are ours until here
            for k_block in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                slot = (None, None, k_block, read.index)
                cute.gemm(tiled_mma, acc, tCrA[slot], tCrB[slot], acc)
            warpgroup.commit_group()
            # the wgmmas of k_tile may still run; those of k_tile - 1 are done, so free their slot
            warpgroup.wait_group(1)
            if k_tile > 0:
                pipe.consumer_release(release)
                release.advance()
            read.advance()
        warpgroup.wait_group(0)
        if k_tiles > 0:
            pipe.consumer_release(release)
        return acc

    @cute.jit
    def _store(
        self,
        tiled_mma: cute.TiledMma,
        tma_c: cute.CopyAtom,
        acc: cute.Tensor,
        sC: cute.Tensor,
        gC: cute.Tensor,
        c_dtype: type,
        warp: cutlass.Int32,
    ) -> None:
        """Accumulator -> C's type -> the smem tile -> one TMA store (clipped at C's edges)."""
        tidx, _, _ = cute.arch.thread_idx()
        out = cute.make_rmem_tensor_like(acc, c_dtype)
        out.store(acc.load().to(c_dtype))
        # stmatrix for 16-bit C; plain stores for fp32
        store_op = sm90.get_smem_store_op(LayoutEnum.ROW_MAJOR, c_dtype, self.acc_dtype)
        r2s = cute.make_tiled_copy_C(store_op, tiled_mma)
        thr_r2s = r2s.get_slice(tidx)
        cute.copy(r2s, thr_r2s.retile(out), thr_r2s.partition_D(sC))
        # make the generic-proxy smem writes visible to TMA, then wait for every consumer thread
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(
            barrier_id=_EPILOGUE_BARRIER, number_of_threads=_CONSUMER_WARPGROUPS * _WARPGROUP_THREADS
        )
        if warp == 0:
            tCsC, tCgC = cpasync.tma_partition(
                tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC, 0, 2)
            )
            cute.copy(tma_c, tCsC, tCgC)
            cute.arch.cp_async_bulk_commit_group()
            # the CTA's smem must outlive the store's reads of it
            cute.arch.cp_async_bulk_wait_group(0, read=True)
