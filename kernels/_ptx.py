"""Single PTX instructions the CuTe DSL does not expose in the form the kernels need.

Each wrapper emits exactly one instruction. Pure ones (no side effects) let LLVM schedule and
deduplicate them; the shared-memory reads are marked as having side effects so they never move
across a barrier.
"""

from __future__ import annotations

from typing import Any

from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

__all__ = ["asm_u32", "cp_async_16_l2_256", "ldmatrix_x4", "prmt", "wgmma_rs"]


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
def ldmatrix_x4(addr: Int32, *, loc=None, ip=None) -> tuple[Uint32, Uint32, Uint32, Uint32]:
    """``ldmatrix.x4`` of four 8x8 b16 matrices; lane ``8m + i`` gives row ``i`` of matrix ``m``.

    Lane ``4g + c`` receives word ``c`` of row ``g`` of each matrix: with matrices (rows 0-7,
    k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) that is exactly an
    ``mma.m16n8k16`` A fragment.
    """
    result = _asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [Int32(addr).ir_value(loc=loc, ip=ip)],
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,r,~{memory}",
        pure=False,
        loc=loc,
        ip=ip,
    )
    return tuple(Uint32(llvm.extractvalue(T.i32(), result, [i], loc=loc, ip=ip)) for i in range(4))


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
    ``desc_b`` describes the K-major B tile in shared memory. Asynchronous: fence before, commit
    and wait after (``cute.nvgpu.warpgroup``); ``acc`` is the ``n / 2`` fp32 accumulators.
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
    result = _asm(
        llvm.StructType.get_literal([T.f32()] * count), values, ptx, constraints, pure=False, loc=loc, ip=ip
    )
    return [Float32(llvm.extractvalue(T.f32(), result, [i], loc=loc, ip=ip)) for i in range(count)]
