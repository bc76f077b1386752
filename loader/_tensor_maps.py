"""TMA tensor maps at launch: each call's encoding of a variant's recorded recipe.

A kernel whose host function builds TMA atoms takes each map as a 128-byte, 64-byte aligned
``CUtensorMap`` parameter, and its variant records how to encode it
(:class:`~b12x_aot.contract.TensorMap`, read by the compiler from the host function). At
launch the loader evaluates the recipe's expressions and encodes with
``cuTensorMapEncodeTiled``, keeping each encoding by (address, dims, strides): a repeated
launch on the same buffers encodes nothing, and a CUDA graph captures the bytes in its node's
parameters like any other parameter word.

A map over an empty tensor (a dim of 0) is 128 zero bytes: the driver refuses to encode it,
and a kernel issues no TMA on an empty operand (the bounded loops run zero times).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from b12x_aot.contract import MAP_BYTES, TensorMap

from .errors import LaunchArgumentError

__all__ = ["MapEncoder", "map_problem"]

_CACHE_LIMIT = 4096  # encodings kept per map before the cache starts over
_EMPTY = bytes(MAP_BYTES)
_DIM_LIMIT = 1 << 32  # cuTensorMapEncodeTiled: each dim at most 2^32
_STRIDE_LIMIT = 1 << 40  # and each stride below 2^40 bytes, a multiple of 16


def map_problem(tmap: TensorMap, address: int, dims: Sequence[int], strides: Sequence[int]) -> str | None:
    """Why ``cuTensorMapEncodeTiled`` would refuse these values, in the caller's terms; None
    when it takes them. ``checked`` asks before launching."""
    align = 32 if tmap.interleave == 2 else 16
    if address % align:
        return f"its data pointer {address:#x} must be {align}-byte aligned for TMA"
    for i, d in enumerate(dims):
        if not 0 <= d <= _DIM_LIMIT:
            return f"TMA dim {i} ({tmap.dims[i]} = {d}) must lie in [0, 2^32]"
    for i, s in enumerate(strides):
        if s % 16 or not 0 < s < _STRIDE_LIMIT:
            return (
                f"TMA stride {i + 1} ({tmap.strides[i]} = {s} B) must be a positive multiple of 16 "
                "bytes below 2^40"
            )
    return None


class MapEncoder:
    """Encodes one tensor-map parameter of one prepared launch and keeps what it encoded.

    ``cache`` maps ``(address, *dims, *strides)`` to the map's bytes; the generated call reads
    it first and calls the encoder only on a miss.
    """

    __slots__ = ("_cu", "_fixed", "cache", "kernel", "tmap")

    def __init__(self, kernel: str, tmap: TensorMap) -> None:
        from cuda.bindings import driver as cu

        self._cu = cu
        self.kernel = kernel
        self.tmap = tmap
        self.cache: dict[tuple[int, ...], bytes] = {}
        self._fixed = (
            [cu.cuuint32_t(b) for b in tmap.box],
            [cu.cuuint32_t(e) for e in tmap.element_strides],
            cu.CUtensorMapInterleave(tmap.interleave),
            cu.CUtensorMapSwizzle(tmap.swizzle),
            cu.CUtensorMapL2promotion(tmap.l2_promotion),
            cu.CUtensorMapFloatOOBfill(tmap.oob_fill),
        )

    def __call__(self, key: tuple[int, ...]) -> bytes:
        encoded = self.encode(key)
        if len(self.cache) >= _CACHE_LIMIT:
            self.cache.clear()
        self.cache[key] = encoded
        return encoded

    def encode(self, key: tuple[int, ...]) -> bytes:
        """The map's bytes for ``(address, *dims, *strides)``; raises
        :class:`LaunchArgumentError` naming the tensor when the driver refuses them."""
        cu, tmap = self._cu, self.tmap
        address, dims, strides = key[0], key[1 : 1 + tmap.rank], key[1 + tmap.rank :]
        if 0 in dims:
            return _EMPTY
        problem = map_problem(tmap, address, dims, strides)
        if problem is None:
            box, element_strides, interleave, swizzle, l2, oob = self._fixed
            result, encoded = cu.cuTensorMapEncodeTiled(
                cu.CUtensorMapDataType(tmap.dtype),
                tmap.rank,
                address,
                [cu.cuuint64_t(d) for d in dims],
                [cu.cuuint64_t(s) for s in strides],
                box,
                element_strides,
                interleave,
                swizzle,
                l2,
                oob,
            )
            if result == cu.CUresult.CUDA_SUCCESS:
                return struct.pack("<16Q", *(int(w) for w in encoded.opaque))
            problem = f"cuTensorMapEncodeTiled refused it ({result.name})"
        raise LaunchArgumentError(
            self.kernel,
            tmap.tensor,
            f"must be a tensor TMA can address: {problem}",
            f"address {address:#x}, dims {list(dims)}, strides {list(strides)} B",
        )
