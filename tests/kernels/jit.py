"""The CuTe DSL's own JIT path for a registry kernel, for AOT-vs-JIT bit-identity tests.

Builds the same kernel class with the same params and geometry as the registry variant,
compiles it with the DSL on this GPU and calls it with real pointers. Needs the DSL.
"""

from __future__ import annotations

from typing import Any

import pytest


def jit_launcher(kernel_class: type, entry: Any, args: list[Any]):
    """Compile ``entry``'s variant with the DSL for the current GPU; return a launcher.

    ``args`` are example arguments in spec order (tensors for pointers, ints for scalars); the
    launcher takes new ones of the same kinds and runs on torch's current stream.
    """
    cute = pytest.importorskip("cutlass.cute")
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import make_ptr

    from b12x_aot.kernels import DSL_SCALARS, dsl_dtype

    def convert(values: list[Any]) -> list[Any]:
        out = []
        for spec_arg, value in zip(entry.args, values, strict=True):
            if spec_arg.is_pointer:
                out.append(
                    make_ptr(
                        dsl_dtype(spec_arg.dtype),
                        value.data_ptr(),
                        cute.AddressSpace.gmem,
                        assumed_align=spec_arg.align,
                    )
                )
            else:
                out.append(DSL_SCALARS[spec_arg.kind](value))
        return out

    kernel = kernel_class(entry.geometry, entry.static, **entry.params)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    compiled = cute.compile(kernel, *convert(args), stream)

    def launch(*values: Any) -> None:
        compiled(*convert(list(values)), cuda.CUstream(torch.cuda.current_stream().cuda_stream))

    return launch
