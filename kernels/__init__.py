"""CuTe DSL kernel sources that the specs name (``b12x_aot.kernels.<module>:<Class>``).

Importing this package imports nothing else: each family module imports the DSL itself, so
planning a build (which only hashes these files) never loads cutlass. The DSL-side pieces the
build and the JIT tests share (:class:`AotKernel`, the dtype tables) load on first use.
"""

from typing import Any

__all__ = ["DSL_DTYPES", "DSL_SCALARS", "AotKernel", "dsl_dtype"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import _base  # imports the CuTe DSL

        return getattr(_base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
