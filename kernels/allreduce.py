"""``comm.allreduce``: the sum of one buffer over ``world`` GPUs, bit-identical on every rank.

``out = sum over r of inp_r`` for ``num_elements`` bf16/fp16 elements (a multiple of 8, at
most ``capacity``). Every element is widened to fp32 exactly, summed in the fixed order
``((x_0 + x_1) + x_2) + ...`` over ranks 0..world-1 with ``add.rn.f32`` (inline PTX, so nothing
reassociates or contracts it) and rounded once, to nearest even, into the dtype. Every rank, both
algorithms and both transports use that one order, so all outputs are bit-identical. ``inp``
is never written; ``out`` may be ``inp`` (a CTA reads each pack of ``inp`` before it writes
``out`` there).

Every rank owns a window (``b12x_aot.comm.layout``): counters, barrier flags and two parities of
``world + 1`` data slots of ``capacity`` elements. ``peers[r]`` is rank ``r``'s window as mapped
in this process; ``ctrl`` is this rank's own. Work is cut into 16-byte packs of 8 elements, and
ranges into balanced parts (``comm.layout.shard``'s rule). CTA ``b`` of every rank touches exactly
the same pack indices in every phase, so it only ever synchronises with CTA ``b`` of the other
ranks, through per-CTA flags; nothing relies on ordering between CTAs of one rank.

- oneshot/pull: stage ``inp`` in own slot 0; barrier; ``out`` = sum of every rank's slot 0
  (own ``inp`` for this rank).
- oneshot/push: write ``inp`` to slot ``rank`` of every peer; barrier; ``out`` = sum of own
  slots (own ``inp`` for this rank).
- twoshot: rank ``k`` owns shard ``k`` of the packs. Pull: stage the other ranks' shards in own
  slot 0; barrier; reduce own shard from every rank's slot 0 into ``out`` and own slot
  ``world``; barrier; copy shard ``k`` from rank ``k``'s slot ``world``. Push: write shard
  ``k`` to rank ``k``'s slot ``rank``; barrier; reduce own shard from own slots into ``out`` and
  every peer's slot ``world``; barrier; copy the other shards from own slot ``world``.

Memory ordering. Data moves with weak 16-byte accesses (``st.global``; window loads
``ld.global.cg``, past L1). Between phases, CTA ``b`` of every rank meets at a barrier of
system-scope release/acquire flags (see ``AllReduce.barrier``), which puts every data write
before it, on any GPU, before every read after it. No trailing barrier is needed: slots
alternate between two parities by call, and a rank can enter call ``n + 2``, which rewrites
call ``n``'s slots, only after passing a barrier of call ``n + 1`` with every peer, which a
peer reaches only after finishing call ``n`` (calls of one communicator are stream-ordered on
each rank). The call counter, and so the generation and parity, lives in the window and is
advanced by the kernel's last CTA, so graph replays stay in step. A barrier waits at most
``timeout_ns``; a CTA that times out records which barrier, rank and CTA it missed, skips
the rest of its work and still ends, as does the kernel.

The runtime guarantees what the kernel relies on: every rank launches the same variant with
the same ``num_elements`` (a multiple of 8, at most ``capacity``), ``capacity * sizeof(dtype)``
is a multiple of 16, and ``peers``/``ctrl`` describe windows of ``comm.layout``'s layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from b12x_aot.comm.layout import (
    ARRIVE_OFFSET,
    CALLS_OFFSET,
    DATA_OFFSET,
    ERROR_PTR_OFFSET,
    ERROR_TIMEOUT,
    MAX_BLOCKS,
    MAX_WORLD,
    PACK_BYTES,
    TIMEOUT_OFFSET,
    flag_offset,
    shard,
)

from ._base import AotKernel, dsl_dtype
from ._ptx import (
    add_rn_f32,
    atom_add_acq_rel_gpu_u32,
    atom_cas_relaxed_sys_b32,
    bar_red_or,
    bf16x2_to_f32,
    cvt_rn_bf16x2_f32,
    cvt_rn_f16x2_f32,
    f16x2_to_f32,
    fence_acq_rel_sys,
    ld_cg_v4,
    ld_relaxed_gpu_u32,
    ld_relaxed_gpu_u64,
    st_relaxed_gpu_u32,
    st_relaxed_sys_u32,
    st_release_sys_u32,
    st_v4,
    wait_flag_acquire_sys,
)

__all__ = ["AllReduce"]

DTYPES = ("bf16", "fp16")
WORLDS = tuple(range(2, MAX_WORLD + 1))
ALGORITHMS = ("oneshot", "twoshot")
TRANSPORTS = ("pull", "push")

# Loads a thread keeps in flight per loop step (all issued before the first store): a copy
# moves COPY_UNROLL packs; a reduction reads `world` packs per output pack, so it unrolls over
# max(1, REDUCE_LOADS // world) output packs. More would cost registers, not bandwidth.
COPY_UNROLL = 4
REDUCE_LOADS = 4


def _part(index, total, parts):
    """``[start, end)`` of part ``index`` of ``total`` units in ``parts`` balanced parts:
    ``comm.layout.shard`` itself, over traced integers."""
    return shard(index, total, parts, minimum=cutlass.min)


@dataclass(frozen=True)  # frozen: the DSL carries it through traced `if`/`for` as read-only
class _Call:
    """The addresses and counters of one call, as this CTA sees them."""

    world: int
    rank: Int32
    table: cute.Tensor  # the peer table: rank r's window base at r
    own: Int64  # this rank's window base
    calls: Uint32  # calls completed before this one
    gen: Uint32  # this call's generation, calls + 1
    parity: Int64  # which half of the data slots this call uses, calls & 1
    slot_bytes: Int64

    @staticmethod
    def start(world: int, width: int, peers: cute.Pointer, ctrl: cute.Pointer, rank: Int32, capacity: Int32):
        """Read the call counter; ``width`` is the element size in bytes."""
        own = ctrl.toint()
        calls = ld_relaxed_gpu_u32(own + CALLS_OFFSET)
        return _Call(
            world=world,
            rank=rank,
            table=AotKernel.tensor(peers, world),
            own=own,
            calls=calls,
            gen=calls + Uint32(1),
            parity=Int64(calls & Uint32(1)),
            slot_bytes=Int64(capacity) * width,
        )

    def peer(self, r) -> Int64:
        """Rank ``r``'s window base (``r`` a constant or traced)."""
        return Int64(self.table[r])

    def slot(self, base: Int64, s) -> Int64:
        """Data slot ``s`` of this call's parity in the window at ``base``."""
        return base + DATA_OFFSET + (self.parity * (self.world + 1) + Int64(s)) * self.slot_bytes


class AllReduce(AotKernel):
    def __init__(
        self,
        geometry,
        static,
        *,
        dtype: str,
        world: int,
        algorithm: str,
        transport: str,
        cta_threads: int,
        blocks: int,
    ):
        super().__init__(
            geometry,
            static,
            dtype=dtype,
            world=world,
            algorithm=algorithm,
            transport=transport,
            cta_threads=cta_threads,
            blocks=blocks,
        )
        for name, value, allowed in (
            ("dtype", dtype, DTYPES),
            ("world", world, WORLDS),
            ("algorithm", algorithm, ALGORITHMS),
            ("transport", transport, TRANSPORTS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))} (got {value!r})")
        if cta_threads % 32 or cta_threads < MAX_WORLD:
            raise ValueError(
                f"cta_threads must be a multiple of 32, at least {MAX_WORLD} (got {cta_threads})"
            )
        if not 1 <= blocks <= MAX_BLOCKS:
            raise ValueError(f"blocks must be in 1..{MAX_BLOCKS}, the window's flag rows (got {blocks})")
        self.element = dsl_dtype(dtype)
        self.world = world
        self.twoshot = algorithm == "twoshot"
        self.pull = transport == "pull"
        self.cta_threads = cta_threads
        self.pack_elements = PACK_BYTES // (self.element.width // 8)

    @cute.jit
    def __call__(
        self,
        out: cute.Pointer,
        inp: cute.Pointer,
        peers: cute.Pointer,
        ctrl: cute.Pointer,
        rank: Int32,
        num_elements: Int32,
        capacity: Int32,
        stream: cuda.CUstream,
    ):
        # At most MAX_BLOCKS CTAs per GPU, each bound by latency: one CTA per SM is all it needs.
        # Saying so (.minnctapersm 1) stops ptxas trading a register spill for occupancy.
        self.kernel(out, inp, peers, ctrl, rank, num_elements, capacity).launch(
            **self.launch_config(rank=rank, num_elements=num_elements, capacity=capacity),
            min_blocks_per_mp=1,
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        out: cute.Pointer,
        inp: cute.Pointer,
        peers: cute.Pointer,
        ctrl: cute.Pointer,
        rank: Int32,
        num_elements: Int32,
        capacity: Int32,
    ):
        tid, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        call = _Call.start(self.world, self.element.width // 8, peers, ctrl, rank, capacity)
        # Never past a slot, whatever the count (the runtime refuses such counts anyway).
        packs = cutlass.max(cutlass.min(num_elements, capacity), Int32(0)) // self.pack_elements
        if cutlass.const_expr(self.twoshot):
            self.twoshot_phases(call, out.toint(), inp.toint(), packs, tid, block, grid)
        else:
            self.oneshot_phases(call, out.toint(), inp.toint(), packs, tid, block, grid)
        self.advance_calls(call, tid, grid)

    # --- algorithms ------------------------------------------------------------------------

    def sources(self, call: _Call, inp: Int64) -> list[Int64]:
        """Where the reduction reads rank ``r``'s data, ``r`` in summation order: ``inp`` for this
        rank; else rank ``r``'s slot 0 (pull) or own slot ``r`` (push)."""
        srcs = []
        for r in range(self.world):
            src = call.slot(call.peer(r), 0) if self.pull else call.slot(call.own, r)
            srcs.append(Int64(cutlass.select_(call.rank == r, inp, src)))
        return srcs

    def every_peer(self, call: _Call, s) -> list[Int64]:
        """Slot ``s`` in every rank's window, indexed by rank (``copy``/``reduce`` take a ``skip``
        index to leave this rank's own out)."""
        return [call.slot(call.peer(k), s) for k in range(self.world)]

    @cute.jit
    def oneshot_phases(
        self, call: _Call, out: Int64, inp: Int64, packs: Int32, tid: Int32, block: Int32, grid: Int32
    ):
        start, end = _part(block, packs, grid)
        if cutlass.const_expr(self.pull):
            self.copy(inp, [call.slot(call.own, 0)], None, start, end, tid)
        else:
            self.copy(inp, self.every_peer(call, call.rank), call.rank, start, end, tid)
        if self.barrier(0, call, tid, block) == 0:
            self.reduce(self.sources(call, inp), [out], None, start, end, tid)

    @cute.jit
    def twoshot_phases(
        self, call: _Call, out: Int64, inp: Int64, packs: Int32, tid: Int32, block: Int32, grid: Int32
    ):
        # Scatter: shard k goes where rank k reads it (own slot 0, or rank k's slot `rank`).
        for k in range(self.world):
            if k != call.rank:
                start, end = self.shard_range(k, packs, block, grid)
                dst = call.slot(call.own, 0)
                if cutlass.const_expr(not self.pull):
                    dst = call.slot(call.peer(k), call.rank)
                self.copy(inp, [dst], None, start, end, tid)
        if self.barrier(0, call, tid, block) == 0:
            # Reduce own shard into out and where the other ranks gather it from.
            start, end = self.shard_range(call.rank, packs, block, grid)
            if cutlass.const_expr(self.pull):
                self.reduce(
                    self.sources(call, inp), [out, call.slot(call.own, self.world)], None, start, end, tid
                )
            else:
                dsts = [out, *self.every_peer(call, self.world)]
                self.reduce(self.sources(call, inp), dsts, call.rank + 1, start, end, tid)
            if self.barrier(1, call, tid, block) == 0:
                # Gather: shard k from rank k's result slot (pull) or own (push).
                for k in range(self.world):
                    if k != call.rank:
                        start, end = self.shard_range(k, packs, block, grid)
                        src = call.slot(call.own, self.world)
                        if cutlass.const_expr(self.pull):
                            src = call.slot(call.peer(k), self.world)
                        self.copy(src, [out], None, start, end, tid)

    def shard_range(self, k, packs: Int32, block: Int32, grid: Int32):
        """CTA ``block``'s part of shard ``k`` (rank ``k``'s part of the packs)."""
        first, last = _part(k, packs, self.world)
        start, end = _part(block, last - first, grid)
        return first + start, first + end

    # --- data movement over one CTA's packs ------------------------------------------------
    # A thread handles packs start + tid, + cta_threads, ... of its CTA's range; byte offsets
    # are 64-bit (a slot may exceed 2 GiB). `dsts` are pack-0 addresses; `skip`, when not
    # None, is the (traced) index of the one destination to leave out.

    @cute.jit
    def for_packs(self, start: Int32, end: Int32, tid: Int32, unroll: int, step, *args):
        """``step(*args, offsets)`` over this thread's packs of ``[start, end)``: ``unroll`` packs
        per call while whole rounds fit, then one at a time."""
        threads = self.cta_threads
        rounds = (end - start) // (threads * unroll)
        for i in cutlass.range(rounds, unroll=1):  # unrolled by hand; keep the code small
            first = start + i * (threads * unroll) + tid
            offsets = []
            for u in cutlass.range_constexpr(unroll):
                offsets.append(Int64(first + u * threads) * PACK_BYTES)
            step(*args, offsets)
        for p in range(start + rounds * (threads * unroll) + tid, end, threads):
            step(*args, [Int64(p) * PACK_BYTES])

    @cute.jit
    def store(self, dsts: list, skip, off: Int64, words):
        """One pack at ``off`` into every destination (a static test when ``skip`` is None)."""
        for k in cutlass.range_constexpr(len(dsts)):
            if cutlass.const_expr(skip is None) or k != skip:
                st_v4(dsts[k] + off, words)

    @cute.jit
    def copy_step(self, src: Int64, dsts: list, skip, offsets: list):
        packs = [ld_cg_v4(src + off) for off in offsets]  # all loads in flight before any store
        for i in cutlass.range_constexpr(len(offsets)):
            self.store(dsts, skip, offsets[i], packs[i])

    @cute.jit
    def reduce_step(self, srcs: list, dsts: list, skip, offsets: list):
        sums = [self.sum_pack(srcs, off) for off in offsets]
        for i in cutlass.range_constexpr(len(offsets)):
            self.store(dsts, skip, offsets[i], sums[i])

    @cute.jit
    def copy(self, src: Int64, dsts: list, skip, start: Int32, end: Int32, tid: Int32):
        """Packs ``[start, end)`` of ``src`` into every destination."""
        self.for_packs(start, end, tid, COPY_UNROLL, self.copy_step, src, dsts, skip)

    @cute.jit
    def reduce(self, srcs: list, dsts: list, skip, start: Int32, end: Int32, tid: Int32):
        """Packs ``[start, end)`` of the ordered sum of ``srcs`` into every destination."""
        unroll = max(1, REDUCE_LOADS // self.world)
        self.for_packs(start, end, tid, unroll, self.reduce_step, srcs, dsts, skip)

    def sum_pack(self, srcs: list, off: Int64) -> list[Uint32]:
        """One pack of the ordered sum ``((x_0 + x_1) + ...)``, rounded once."""
        return self.narrow(self.sum_f32(srcs, off))

    def sum_f32(self, srcs: list, off: Int64) -> list[Float32]:
        """One pack of the ordered sum ``((x_0 + x_1) + ...)``, still in fp32."""
        packs = [ld_cg_v4(src + off) for src in srcs]  # every rank's pack in flight at once
        acc: list[Float32] = []
        for r, pack in enumerate(packs):
            values = self.widen(pack)
            acc = values if r == 0 else [add_rn_f32(a, x) for a, x in zip(acc, values, strict=True)]
        return acc

    def widen(self, pack) -> list[Float32]:
        """A pack's 8 elements in fp32, exactly (element 2i in the low half of word i)."""
        widen = bf16x2_to_f32 if self.element is cutlass.BFloat16 else f16x2_to_f32
        return [x for word in pack for x in widen(word)]

    def narrow(self, values: list) -> list[Uint32]:
        """fp32 values rounded once, to nearest even, into packed words of the dtype."""
        narrow = cvt_rn_bf16x2_f32 if self.element is cutlass.BFloat16 else cvt_rn_f16x2_f32
        return [narrow(values[2 * i + 1], values[2 * i]) for i in range(len(values) // 2)]

    # --- cross-GPU barrier and call counter ------------------------------------------------

    @cute.jit
    def barrier(self, bar: int, call: _Call, tid: Int32, block: Int32) -> Int32:
        """Meet CTA ``block`` of every rank at barrier ``bar``; 1 (in every thread) on timeout.

        Ordering, all at system scope (a gpu-scope release or acquire orders nothing for
        another GPU). Each thread's ``fence.acq_rel.sys`` orders its own data writes, local or
        remote over NVLink, before what it does next; ``bar.sync`` puts all of them before
        thread ``t``'s ``st.release.sys`` of the flag in rank ``t``'s window. Leaning on the
        release's cumulativity through a CTA barrier alone is how torn reads shipped; the
        per-thread fence leaves nothing to it. On the other side, thread ``t``'s
        ``ld.acquire.sys`` of the flag rank ``t`` set, then ``bar.red``, put those writes before
        every later read of this CTA, and those reads skip L1 (``ld.cg``), so no line cached
        earlier can be served. Flags hold generations, not toggles, compared wrap-safely
        (``(int)(seen - gen) >= 0``): a peer already one call ahead has written ``gen + 1``,
        which must count as arrived, and the u32 wraps after 2^32 calls. Both barriers of a
        call signal the same generation, so each has its own flag slots; with one, the second
        wait would pass on the first signal. The generation comes from ``calls`` in device
        memory, advanced by the kernel, never from a launch argument: a captured CUDA graph
        replays with the right generation and parity every time.
        """
        fence_acq_rel_sys()
        cute.arch.sync_threads()
        late = Int32(0)
        if tid < self.world:
            st_release_sys_u32(call.peer(tid) + Int64(flag_offset(bar, block, call.rank)), call.gen)
            timeout = ld_relaxed_gpu_u64(call.own + TIMEOUT_OFFSET)
            late = wait_flag_acquire_sys(call.own + Int64(flag_offset(bar, block, tid)), call.gen, timeout)
            if late != 0:
                self.record_timeout(call, bar, tid, block)
        return bar_red_or(late)

    @cute.jit
    def record_timeout(self, call: _Call, bar: int, missing: Int32, block: Int32):
        """Record a timeout in the host-mapped error record: the generation waited for (word 1,
        the same for every CTA of the call, so any writer will do), then, fenced after it, which
        barrier, rank and CTA (word 0; the first to swap it in wins, where the platform makes
        host-memory atomics atomic). The host reads word 0 first, so word 1 is there by then."""
        record = ld_relaxed_gpu_u64(call.own + ERROR_PTR_OFFSET)
        if record != 0:
            st_relaxed_sys_u32(record + 4, call.gen)
            fence_acq_rel_sys()
            code = Uint32(ERROR_TIMEOUT | bar << 24) | (Uint32(missing) << 16) | Uint32(block)
            atom_cas_relaxed_sys_b32(record, Uint32(0), code)

    @cute.jit
    def advance_calls(self, call: _Call, tid: Int32, grid: Int32):
        """The last CTA to finish resets ``arrive`` and advances ``calls`` (after a timeout too).
        Every CTA read ``calls`` before arriving, so none sees the new value; the next kernel
        on the stream does."""
        cute.arch.sync_threads()
        if tid == 0:
            arrived = atom_add_acq_rel_gpu_u32(call.own + ARRIVE_OFFSET, Uint32(1))
            if arrived == Uint32(grid - 1):
                st_relaxed_gpu_u32(call.own + ARRIVE_OFFSET, Uint32(0))
                st_relaxed_gpu_u32(call.own + CALLS_OFFSET, call.calls + Uint32(1))
