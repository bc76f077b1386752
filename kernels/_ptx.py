"""Single PTX instructions the CuTe DSL does not expose in the form the kernels need.

Each wrapper emits exactly one instruction, or one tight block where a single operation needs a
few (a predicate test, a spin loop). Pure ones (no side effects) let LLVM schedule and
deduplicate them; memory accesses are marked as having side effects and clobbering memory so
they never move across a barrier, a fence or each other.
"""

from __future__ import annotations

from typing import Any

from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

__all__ = [
    "add_rn_f32",
    "asm_u32",
    "atom_add_acq_rel_gpu_u32",
    "atom_cas_relaxed_sys_b32",
    "bar_red_or",
    "bf16x2_to_f32",
    "cp_async_4",
    "cp_async_16_l2_256",
    "cp_async_bulk_g2s",
    "cvt_rn_bf16x2_f32",
    "cvt_rn_f16x2_f32",
    "div_rn_f32",
    "f16x2_to_f32",
    "fence_acq_rel_sys",
    "ld_cg_v4",
    "ld_relaxed_gpu_u32",
    "ld_relaxed_gpu_u64",
    "ld_v4_if",
    "ldmatrix_x4",
    "mul_rn_f32",
    "pack_b64",
    "prmt",
    "red_shared_add_u32",
    "rsqrt_approx_f32",
    "st_cluster_f32",
    "st_relaxed_gpu_u32",
    "st_relaxed_sys_u32",
    "st_release_sys_u32",
    "st_v4",
    "wait_flag_acquire_sys",
    "wgmma_rs",
]


def _asm(result: Any, operands: list[Any], ptx: str, constraints: str, *, pure: bool, loc, ip) -> Any:
    return llvm.inline_asm(
        result,
        operands,
        ptx,
        constraints,
        has_side_effects=not pure,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


def _asm_results(
    kind: type, count: int, operands: list[Any], ptx: str, constraints: str, *, pure: bool, loc, ip
) -> list[Any]:
    """One instruction with ``count`` results of ``kind`` (Uint32 or Float32), unpacked."""
    ir_type = T.f32() if kind is Float32 else T.i32()
    result = _asm(
        llvm.StructType.get_literal([ir_type] * count), operands, ptx, constraints, pure=pure, loc=loc, ip=ip
    )
    return [kind(llvm.extractvalue(ir_type, result, [i], loc=loc, ip=ip)) for i in range(count)]


@dsl_user_op
def asm_u32(ptx: str, *operands: Uint32, loc=None, ip=None) -> Uint32:
    """One pure instruction with a ``.b32`` result and ``.b32`` register operands ``$1..``."""
    values = [Uint32(x).ir_value(loc=loc, ip=ip) for x in operands]
    return Uint32(_asm(T.i32(), values, ptx, "=r" + ",r" * len(values), pure=True, loc=loc, ip=ip))


@dsl_user_op
def prmt(a: Uint32, b: Uint32, selector: int | Uint32, *, loc=None, ip=None) -> Uint32:
    """``prmt.b32``: four bytes of ``{b, a}`` picked by ``selector``, a constant or a per-lane
    register (pure, unlike ``cute.arch.prmt``)."""
    immediate = isinstance(selector, int)
    values = [Uint32(a).ir_value(loc=loc, ip=ip), Uint32(b).ir_value(loc=loc, ip=ip)]
    values.append((Int32 if immediate else Uint32)(selector).ir_value(loc=loc, ip=ip))
    constraints = "=r,r,r," + ("n" if immediate else "r")
    return Uint32(_asm(T.i32(), values, "prmt.b32 $0, $1, $2, $3;", constraints, pure=True, loc=loc, ip=ip))


@dsl_user_op
def cp_async_16_l2_256(dst: Int32, src: Int64, *, loc=None, ip=None) -> None:
    """16-byte ``cp.async.cg`` from global ``src`` to shared ``dst``, asking L2 for the 256 B around it.

    For rows read a few dozen bytes per k-tile, the next k-tiles then find theirs in L2.
    """
    values = [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip)]
    ptx = "cp.async.cg.shared.global.L2::256B [$0], [$1], 16;"
    _asm(None, values, ptx, "r,l,~{memory}", pure=False, loc=loc, ip=ip)


@dsl_user_op
def cp_async_4(dst: Int32, src: Int64, *, loc=None, ip=None) -> None:
    """4-byte ``cp.async.ca`` from global ``src`` to shared ``dst``."""
    values = [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip)]
    _asm(
        None, values, "cp.async.ca.shared.global [$0], [$1], 4;", "r,l,~{memory}", pure=False, loc=loc, ip=ip
    )


@dsl_user_op
def cp_async_bulk_g2s(dst: Int32, src: Int64, size: int, mbar: Int32, *, loc=None, ip=None) -> None:
    """``cp.async.bulk`` of ``size`` contiguous bytes (a multiple of 16) from global ``src`` to
    this CTA's shared ``dst``, completing as ``size`` transaction bytes on the mbarrier at
    shared ``mbar``."""
    values = [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip)]
    values.append(Int32(mbar).ir_value(loc=loc, ip=ip))
    ptx = f"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], {size}, [$2];"
    _asm(None, values, ptx, "r,l,r,~{memory}", pure=False, loc=loc, ip=ip)


@dsl_user_op
def red_shared_add_u32(addr: Int32, value: Uint32, *, loc=None, ip=None) -> None:
    """``red.shared.add.u32``: atomically add ``value`` to the shared word at ``addr`` (no result)."""
    values = [Int32(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)]
    _asm(None, values, "red.shared.add.u32 [$0], $1;", "r,r,~{memory}", pure=False, loc=loc, ip=ip)


@dsl_user_op
def st_cluster_f32(addr: Int32, rank: Int32, value: Float32, *, loc=None, ip=None) -> None:
    """Store ``value`` at this CTA's shared address ``addr`` in cluster CTA ``rank``'s shared
    memory (``mapa`` + ``st.shared::cluster``)."""
    ptx = "{ .reg .b32 at; mapa.shared::cluster.u32 at, $0, $1; st.shared::cluster.f32 [at], $2; }"
    values = [Int32(addr).ir_value(loc=loc, ip=ip), Int32(rank).ir_value(loc=loc, ip=ip)]
    values.append(Float32(value).ir_value(loc=loc, ip=ip))
    _asm(None, values, ptx, "r,r,f,~{memory}", pure=False, loc=loc, ip=ip)


@dsl_user_op
def ldmatrix_x4(addr: Int32, *, loc=None, ip=None) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """``ldmatrix.x4`` of four 8x8 b16 matrices; lane ``8m + i`` gives row ``i`` of matrix ``m``.

    Lane ``4g + c`` receives word ``c`` of row ``g`` of each matrix: with matrices (rows 0-7,
    k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) that is exactly an
    ``mma.m16n8k16`` A fragment.
    """
    ptx = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];"
    values = [Int32(addr).ir_value(loc=loc, ip=ip)]
    return tuple(_asm_results(Uint32, 4, values, ptx, "=r,=r,=r,=r,r,~{memory}", pure=False, loc=loc, ip=ip))


@dsl_user_op
def wgmma_rs(
    acc: list[Float32],
    a: tuple[Uint32, Uint32, Uint32, Uint32],
    desc_b: Int64,
    *,
    n: int,
    ab: str,
    loc=None,
    ip=None,
) -> list[Float32]:
    """``wgmma.mma_async`` m64 x ``n`` x k16 with A from registers, accumulating into fp32 ``acc``.

    ``a`` is this thread's A fragment (the ``mma.m16n8k16`` A layout of its warp's 16 rows);
    ``desc_b`` describes the K-major B tile in shared memory (see :func:`pack_b64`).
    Asynchronous: fence before, commit and wait after (``cute.nvgpu.warpgroup``); ``acc`` is
    the ``n / 2`` fp32 accumulators.
    """
    count = n // 2
    regs = ", ".join(f"${i}" for i in range(count))
    a_regs = ", ".join(f"${count + i}" for i in range(4))
    # scale-d is a predicate: true keeps accumulating into d.
    ptx = (
        f"{{ .reg .pred p; setp.ne.b32 p, ${count + 5}, 0; "
        f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} {{{regs}}}, {{{a_regs}}}, ${count + 4}, p, 1, 1, 0; }}"
    )
    values = [Uint32(x).ir_value(loc=loc, ip=ip) for x in a]
    values += [Int64(desc_b).ir_value(loc=loc, ip=ip), Int32(1).ir_value(loc=loc, ip=ip)]
    values += [Float32(x).ir_value(loc=loc, ip=ip) for x in acc]
    constraints = ",".join(["=f"] * count + ["r"] * 4 + ["l", "r"] + [str(i) for i in range(count)])
    return _asm_results(Float32, count, values, ptx, constraints, pure=False, loc=loc, ip=ip)


@dsl_user_op
def pack_b64(lo: Uint32, hi: Uint32, *, loc=None, ip=None) -> Int64:
    """``mov.b64 {lo, hi}``: a 64-bit value from its 32-bit halves (pure). A wgmma descriptor
    built so costs one add per k-step on its low word, where 64-bit arithmetic on the whole
    descriptor costs several uniform instructions."""
    values = [Uint32(lo).ir_value(loc=loc, ip=ip), Uint32(hi).ir_value(loc=loc, ip=ip)]
    return Int64(_asm(T.i64(), values, "mov.b64 $0, {$1, $2};", "=l,r,r", pure=True, loc=loc, ip=ip))


# --- fp32 arithmetic and conversions with a fixed rounding ---------------------------------


@dsl_user_op
def add_rn_f32(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``add.rn.f32``: one correctly rounded add. As inline PTX no pass can reassociate it or
    contract it with a multiply, so a chain of these is a fixed summation order (pure)."""
    return _f32_op("add.rn.f32 $0, $1, $2;", (a, b), loc, ip)


def _f32_op(ptx: str, operands: tuple, loc, ip) -> Float32:
    """One pure fp32 instruction of ``operands`` as inline PTX (never reassociated or fused)."""
    values = [Float32(x).ir_value(loc=loc, ip=ip) for x in operands]
    constraints = ",".join(["=f"] + ["f"] * len(values))
    return Float32(_asm(T.f32(), values, ptx, constraints, pure=True, loc=loc, ip=ip))


@dsl_user_op
def mul_rn_f32(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``mul.rn.f32``: one correctly rounded multiply, never contracted into an fma (pure)."""
    return _f32_op("mul.rn.f32 $0, $1, $2;", (a, b), loc, ip)


@dsl_user_op
def div_rn_f32(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``div.rn.f32``: the IEEE correctly rounded quotient (pure)."""
    return _f32_op("div.rn.f32 $0, $1, $2;", (a, b), loc, ip)


@dsl_user_op
def rsqrt_approx_f32(a: Float32, *, loc=None, ip=None) -> Float32:
    """``rsqrt.approx.f32``: 1/sqrt(a), within 2^-22.9 relative; the same bits for the same input
    on a given GPU model (pure)."""
    return _f32_op("rsqrt.approx.f32 $0, $1;", (a,), loc, ip)


def _unpack_f32x2(packed: Uint32, ptx: str, loc, ip) -> tuple[Float32, Float32]:
    values = [Uint32(packed).ir_value(loc=loc, ip=ip)]
    return tuple(_asm_results(Float32, 2, values, ptx, "=f,=f,r", pure=True, loc=loc, ip=ip))


@dsl_user_op
def bf16x2_to_f32(packed: Uint32, *, loc=None, ip=None) -> tuple[Float32, Float32]:
    """The two bf16 halves of ``packed`` as fp32 ``(low, high)``: exact, bf16 being the top half
    of an fp32 (``shl`` and ``and``; pure)."""
    return _unpack_f32x2(packed, "shl.b32 $0, $2, 16;\n\tand.b32 $1, $2, 0xffff0000;", loc, ip)


@dsl_user_op
def f16x2_to_f32(packed: Uint32, *, loc=None, ip=None) -> tuple[Float32, Float32]:
    """The two fp16 halves of ``packed`` as fp32 ``(low, high)``: two exact ``cvt.f32.f16`` (pure)."""
    ptx = "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }"
    return _unpack_f32x2(packed, ptx, loc, ip)


def _pack_x2(op: str, hi: Float32, lo: Float32, loc, ip) -> Uint32:
    values = [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)]
    return Uint32(_asm(T.i32(), values, f"{op} $0, $1, $2;", "=r,f,f", pure=True, loc=loc, ip=ip))


@dsl_user_op
def cvt_rn_bf16x2_f32(hi: Float32, lo: Float32, *, loc=None, ip=None) -> Uint32:
    """``cvt.rn.bf16x2.f32``: ``hi`` and ``lo`` rounded once, to nearest even, into the high and
    low bf16 halves of one word (pure)."""
    return _pack_x2("cvt.rn.bf16x2.f32", hi, lo, loc, ip)


@dsl_user_op
def cvt_rn_f16x2_f32(hi: Float32, lo: Float32, *, loc=None, ip=None) -> Uint32:
    """``cvt.rn.f16x2.f32``: ``hi`` and ``lo`` rounded once, to nearest even, into the high and
    low fp16 halves of one word (pure)."""
    return _pack_x2("cvt.rn.f16x2.f32", hi, lo, loc, ip)


# --- global memory: 16-byte data moves and the ordered accesses of cross-GPU barriers ---------
# Addresses are 64-bit global addresses (``Pointer.toint()`` plus byte offsets), possibly into
# a peer GPU's memory mapped into this process.


@dsl_user_op
def ld_cg_v4(addr: Int64, *, loc=None, ip=None) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """``ld.global.cg.v4.u32``: 16 bytes cached in L2 only, so a line another GPU (or another
    kernel) wrote is never served stale from this SM's L1."""
    ptx = "ld.global.cg.v4.u32 {$0, $1, $2, $3}, [$4];"
    values = [Int64(addr).ir_value(loc=loc, ip=ip)]
    return tuple(_asm_results(Uint32, 4, values, ptx, "=r,=r,=r,=r,l,~{memory}", pure=False, loc=loc, ip=ip))


@dsl_user_op
def ld_v4_if(pred: Int32, addr: Int64, *, loc=None, ip=None) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """``@p ld.global.v4.u32``: 16 bytes when ``pred`` is non-zero, else no access at all (the
    results are then undefined). Ordered with the other accesses, so a run of them stays a run
    of loads in flight together, where guarded DSL loads may each wait behind the math before."""
    ptx = "{ .reg .pred p; setp.ne.s32 p, $4, 0; @p ld.global.v4.u32 {$0, $1, $2, $3}, [$5]; }"
    values = [Int32(pred).ir_value(loc=loc, ip=ip), Int64(addr).ir_value(loc=loc, ip=ip)]
    return tuple(
        _asm_results(Uint32, 4, values, ptx, "=r,=r,=r,=r,r,l,~{memory}", pure=False, loc=loc, ip=ip)
    )


@dsl_user_op
def st_v4(addr: Int64, words: tuple[Uint32, Uint32, Uint32, Uint32], *, loc=None, ip=None) -> None:
    """``st.global.v4.u32``: one 16-byte store (a weak store: publish it with a release)."""
    values = [Int64(addr).ir_value(loc=loc, ip=ip), *(Uint32(w).ir_value(loc=loc, ip=ip) for w in words)]
    ptx = "st.global.v4.u32 [$0], {$1, $2, $3, $4};"
    _asm(None, values, ptx, "l,r,r,r,r,~{memory}", pure=False, loc=loc, ip=ip)


def _load(kind: type, ptx: str, reg: str, addr: Int64, loc, ip) -> Any:
    ir_type = T.i64() if kind is Int64 else T.i32()
    values = [Int64(addr).ir_value(loc=loc, ip=ip)]
    return kind(_asm(ir_type, values, ptx, f"={reg},l,~{{memory}}", pure=False, loc=loc, ip=ip))


def _store(ptx: str, addr: Int64, value: Uint32, loc, ip) -> None:
    values = [Int64(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)]
    _asm(None, values, ptx, "l,r,~{memory}", pure=False, loc=loc, ip=ip)


@dsl_user_op
def ld_relaxed_gpu_u32(addr: Int64, *, loc=None, ip=None) -> Uint32:
    """``ld.relaxed.gpu.global.u32``: a coherent 32-bit read (never a stale L1 line)."""
    return _load(Uint32, "ld.relaxed.gpu.global.u32 $0, [$1];", "r", addr, loc, ip)


@dsl_user_op
def ld_relaxed_gpu_u64(addr: Int64, *, loc=None, ip=None) -> Int64:
    """``ld.relaxed.gpu.global.u64``: a coherent 64-bit read (never a stale L1 line)."""
    return _load(Int64, "ld.relaxed.gpu.global.u64 $0, [$1];", "l", addr, loc, ip)


@dsl_user_op
def st_relaxed_gpu_u32(addr: Int64, value: Uint32, *, loc=None, ip=None) -> None:
    """``st.relaxed.gpu.global.u32``: a coherent 32-bit write, seen by later kernels."""
    _store("st.relaxed.gpu.global.u32 [$0], $1;", addr, value, loc, ip)


@dsl_user_op
def st_relaxed_sys_u32(addr: Int64, value: Uint32, *, loc=None, ip=None) -> None:
    """``st.relaxed.sys.global.u32``: a 32-bit write coherent with the host and other GPUs."""
    _store("st.relaxed.sys.global.u32 [$0], $1;", addr, value, loc, ip)


@dsl_user_op
def st_release_sys_u32(addr: Int64, value: Uint32, *, loc=None, ip=None) -> None:
    """``st.release.sys.global.u32``: a 32-bit write that whoever acquires it at system scope sees
    after everything this thread (and, cumulatively, its CTA before a barrier) wrote earlier."""
    _store("st.release.sys.global.u32 [$0], $1;", addr, value, loc, ip)


@dsl_user_op
def fence_acq_rel_sys(*, loc=None, ip=None) -> None:
    """``fence.acq_rel.sys``: orders this thread's earlier memory accesses, local and remote,
    before its later ones for observers anywhere in the system."""
    _asm(None, [], "fence.acq_rel.sys;", "~{memory}", pure=False, loc=loc, ip=ip)


@dsl_user_op
def atom_add_acq_rel_gpu_u32(addr: Int64, value: Uint32, *, loc=None, ip=None) -> Uint32:
    """``atom.acq_rel.gpu.global.add.u32``: adds ``value``; returns the old word."""
    values = [Int64(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)]
    ptx = "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;"
    return Uint32(_asm(T.i32(), values, ptx, "=r,l,r,~{memory}", pure=False, loc=loc, ip=ip))


@dsl_user_op
def atom_cas_relaxed_sys_b32(addr: Int64, expected: Uint32, desired: Uint32, *, loc=None, ip=None) -> Uint32:
    """``atom.relaxed.sys.global.cas.b32``: writes ``desired`` if the word is ``expected``;
    returns the old word (so the caller knows whether it won)."""
    values = [Int64(addr).ir_value(loc=loc, ip=ip)]
    values += [Uint32(expected).ir_value(loc=loc, ip=ip), Uint32(desired).ir_value(loc=loc, ip=ip)]
    ptx = "atom.relaxed.sys.global.cas.b32 $0, [$1], $2, $3;"
    return Uint32(_asm(T.i32(), values, ptx, "=r,l,r,r,~{memory}", pure=False, loc=loc, ip=ip))


@dsl_user_op
def wait_flag_acquire_sys(addr: Int64, target: Uint32, timeout_ns: Int64, *, loc=None, ip=None) -> Int32:
    """Spin with ``ld.acquire.sys`` until the u32 at ``addr`` has reached ``target``; 1 if
    ``timeout_ns`` of ``%globaltimer`` passed first, else 0.

    "Reached" is the wrap-safe ``(int)(seen - target) >= 0``, so a flag already one generation
    ahead also passes. The flag is checked before the clock, so even a zero timeout passes a
    flag that is set. Labels carry LLVM's per-instance ``${:uid}``, so the block may be inlined
    any number of times.
    """
    ptx = (
        "{\n\t"
        ".reg .pred p;\n\t.reg .b32 seen;\n\t.reg .b64 t0, t1;\n\t"
        "mov.u64 t0, %globaltimer;\n"
        "L_wait_${:uid}:\n\t"
        "ld.acquire.sys.global.u32 seen, [$1];\n\t"
        "sub.u32 seen, seen, $2;\n\t"
        "setp.ge.s32 p, seen, 0;\n\t"
        "@p bra L_done_${:uid};\n\t"
        "mov.u64 t1, %globaltimer;\n\t"
        "sub.u64 t1, t1, t0;\n\t"
        "setp.lt.u64 p, t1, $3;\n\t"
        "@p bra L_wait_${:uid};\n\t"
        "mov.u32 $0, 1;\n\t"
        "bra L_end_${:uid};\n"
        "L_done_${:uid}:\n\t"
        "mov.u32 $0, 0;\n"
        "L_end_${:uid}:\n\t"
        "}"
    )
    values = [Int64(addr).ir_value(loc=loc, ip=ip), Uint32(target).ir_value(loc=loc, ip=ip)]
    values.append(Int64(timeout_ns).ir_value(loc=loc, ip=ip))
    return Int32(_asm(T.i32(), values, ptx, "=r,l,r,l,~{memory}", pure=False, loc=loc, ip=ip))


@dsl_user_op
def bar_red_or(pred: Int32, *, loc=None, ip=None) -> Int32:
    """``bar.red.or.pred`` on barrier 0: a CTA-wide barrier that returns 1 to every thread if
    ``pred`` was non-zero in any of them, else 0. All threads of the CTA must call it."""
    ptx = "{ .reg .pred p; setp.ne.s32 p, $1, 0; bar.red.or.pred p, 0, p; selp.s32 $0, 1, 0, p; }"
    values = [Int32(pred).ir_value(loc=loc, ip=ip)]
    return Int32(_asm(T.i32(), values, ptx, "=r,r,~{memory}", pure=False, loc=loc, ip=ip))
