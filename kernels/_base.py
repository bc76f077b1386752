"""What every registry kernel shares: DSL element types and the spec-driven launch.

A registry kernel is a class constructed as ``Kernel(geometry, static, **params)``: the spec's
launch geometry, its static part (block, shared memory, cluster) as the planner evaluated it
once for these params, and the params. Its ``@cute.jit`` ``__call__`` takes the spec's
arguments in order (``cute.Pointer`` and integer scalars) and a stream, and launches with
:meth:`AotKernel.launch_config`, so the geometry the DSL compiles in is exactly the spec's,
the same that the loader evaluates at launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import BaseDSL

from b12x_aot.contract import TRACED, Geometry, StaticGeometry

__all__ = ["DSL_DTYPES", "DSL_SCALARS", "AotKernel", "dsl_dtype"]

DSL_DTYPES: Mapping[str, type] = {
    "fp64": cutlass.Float64,
    "fp32": cutlass.Float32,
    "fp16": cutlass.Float16,
    "bf16": cutlass.BFloat16,
    "fp8_e4m3": cutlass.Float8E4M3FN,
    "i64": cutlass.Int64,
    "i32": cutlass.Int32,
    "i16": cutlass.Int16,
    "i8": cutlass.Int8,
    "u64": cutlass.Uint64,
    "u32": cutlass.Uint32,
    "u16": cutlass.Uint16,
    "u8": cutlass.Uint8,
}

DSL_SCALARS: Mapping[str, type] = {
    "i32": cutlass.Int32,
    "u32": cutlass.Uint32,
    "i64": cutlass.Int64,
    "u64": cutlass.Uint64,
    "f32": cutlass.Float32,
    "f64": cutlass.Float64,
}


def _select(test: Any, if_value: Any, else_value: Any) -> Any:
    """``if_value if test else else_value`` for a traced or a plain test."""
    if isinstance(test, bool):
        return if_value if test else else_value
    # select_ hands back a bare IR value: give it the branches' DSL type again
    typed = next((v for v in (if_value, else_value) if isinstance(v, cutlass.Numeric)), cutlass.Int32(0))
    return type(typed)(cutlass.select_(test, if_value, else_value))


# The grid reads runtime scalars, which the DSL traces: Python's min/max cannot compare those,
# nor can Python's conditionals and boolean operators test them.
_TRACED_FUNCTIONS = {
    TRACED: True,
    "min": cutlass.min,
    "max": cutlass.max,
    "select": _select,
    "and": cutlass.and_,
    "or": cutlass.or_,
    "not": cutlass.not_,
}


def dsl_dtype(name: str) -> type:
    """The DSL numeric type for a spec dtype name."""
    try:
        return DSL_DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DSL_DTYPES)} (got {name!r})") from None


class AotKernel:
    """Base class of registry kernels: keeps the params and the spec's launch geometry."""

    def __init__(self, geometry: Geometry, static: StaticGeometry, **params: Any) -> None:
        self.geometry = geometry
        self.static = static
        self.params = dict(params)

    def launch_config(self, **runtime: Any) -> dict[str, Any]:
        """``grid``, ``block`` and ``smem`` for ``.launch()``, from the spec's expressions (a
        spec that leaves ``smem`` out lets the DSL size it from the kernel's allocations)."""
        if self.static.block is None:
            raise ValueError(f"{type(self).__name__} launches with the spec's block: declare launch.block")
        config: dict[str, Any] = {
            "grid": list(self.geometry.grid_of({**self.params, **runtime}, _TRACED_FUNCTIONS)),
            "block": list(self.static.block),
        }
        if self.static.smem is not None:
            config["smem"] = self.static.smem
        if self.static.cluster is not None:
            config["cluster"] = list(self.static.cluster)
        return config

    @staticmethod
    def target_arch() -> str:
        """The arch being compiled for, e.g. ``"sm_90a"``: ``--gpu-arch``, else ``CUTE_DSL_ARCH``,
        else the GPU's. Call while tracing, when a kernel picks instructions by arch."""
        return BaseDSL._get_dsl().get_arch_enum().name

    @staticmethod
    def tensor(ptr: cute.Pointer, extent: Any) -> cute.Tensor:
        """A flat 1-D view of ``extent`` elements starting at ``ptr``."""
        return cute.make_tensor(ptr, cute.make_layout(extent))

    @staticmethod
    def vectors(ptr: cute.Pointer, width: int, count: Any) -> cute.Tensor:
        """``(width, count)`` view: column ``i`` is the ``i``-th ``width``-element vector.

        With the pointer's declared alignment and a static ``width``, each column is known to
        be aligned, so copies of a column vectorise to 16-byte accesses.
        """
        return cute.make_tensor(ptr, cute.make_layout((width, count), stride=(1, width)))
