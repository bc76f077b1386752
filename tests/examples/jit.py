"""The CuTe DSL's own JIT path of an example kernel, for AOT-vs-JIT comparisons.

The example classes are built as their specs build them (the same constructor arguments),
compiled by the DSL on this GPU from torch tensors, and called with torch tensors, as a user of
the DSL would. Needs the DSL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def jit_call(kernel: Any, tensors: list[Any], mark: Callable[[Any], Any] | None = None) -> Callable:
    """Compile ``kernel`` for tensors laid out like ``tensors``; a launcher taking new ones
    (same layouts) and a stream. ``mark`` marks each ``from_dlpack`` tensor's dynamic modes
    (default: ``mark_layout_dynamic()``)."""
    cute = pytest.importorskip("cutlass.cute")
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import from_dlpack

    def wrap(values: list[Any]) -> list[Any]:
        marked = mark or (lambda t: t.mark_layout_dynamic())
        return [marked(from_dlpack(t, assumed_align=16 if mark else None)) for t in values]

    compiled = cute.compile(kernel, *wrap(tensors), cuda.CUstream(0))

    def launch(*values: Any, stream: Any) -> None:
        compiled(*wrap(list(values)), cuda.CUstream(int(stream)))

    return launch
