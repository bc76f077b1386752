"""TMA tensor maps at launch: the recipe a variant records, and its encoding per call.

A kernel whose host function builds TMA atoms takes each map as a 128-byte, 64-byte aligned
``CUtensorMap`` parameter. The compiler reads from the host function how the DSL encodes it
(``compiler/_tensor_map``) and records a :class:`TensorMap`: the operand tensor, the data
type, the map's dims (elements, innermost first) and strides (bytes) as expressions over the
launch's input words, and the constants (box, element strides, interleave, swizzle, L2
promotion, out-of-bounds fill). At launch the loader evaluates the expressions and encodes
with ``cuTensorMapEncodeTiled``, keeping each encoding by (address, dims, strides): a repeated
launch on the same buffers encodes nothing, and a CUDA graph captures the bytes in its node's
parameters like any other parameter word.

A map over an empty tensor (a dim of 0) is 128 zero bytes: the driver refuses to encode it,
and a kernel issues no TMA on an empty operand (the bounded loops run zero times).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .errors import LaunchArgumentError

__all__ = ["MAP_ALIGN", "MAP_BYTES", "MAP_ELEMENT_BYTES", "MapEncoder", "TensorMap", "map_problem"]

MAP_BYTES = 128
MAP_ALIGN = 64
_CACHE_LIMIT = 4096  # encodings kept per map before the cache starts over
_EMPTY = bytes(MAP_BYTES)
_DIM_LIMIT = 1 << 32  # cuTensorMapEncodeTiled: each dim at most 2^32
_STRIDE_LIMIT = 1 << 40  # and each stride below 2^40 bytes, a multiple of 16
# CUtensorMapDataType value -> element bytes (the driver's enum; 16U4 packings are not read)
MAP_ELEMENT_BYTES = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 4, 11: 4, 12: 4}


class TensorMap(NamedTuple):
    """How one tensor-map parameter is encoded from a launch's arguments."""

    tensor: str  # the argument whose data pointer is the map's global address
    dtype: int  # CUtensorMapDataType
    dims: tuple[str, ...]  # globalDim, innermost first: expressions over the input words
    strides: tuple[str, ...]  # globalStrides of dims 1.. in bytes: expressions
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: int  # CUtensorMapInterleave
    swizzle: int  # CUtensorMapSwizzle
    l2_promotion: int  # CUtensorMapL2promotion
    oob_fill: int  # CUtensorMapFloatOOBfill

    @property
    def rank(self) -> int:
        return len(self.dims)

    def to_json(self) -> dict[str, Any]:
        out = self._asdict()
        for name in ("dims", "strides", "box", "element_strides"):
            out[name] = list(out[name])
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorMap:
        return cls(
            str(data["tensor"]),
            int(data["dtype"]),
            tuple(str(d) for d in data["dims"]),
            tuple(str(s) for s in data["strides"]),
            tuple(int(b) for b in data["box"]),
            tuple(int(e) for e in data["element_strides"]),
            int(data["interleave"]),
            int(data["swizzle"]),
            int(data["l2_promotion"]),
            int(data["oob_fill"]),
        )

    def describe(self) -> str:
        return (
            f"tensor map of {self.tensor} (dims {list(self.dims)}, strides {list(self.strides)} B, "
            f"box {list(self.box)}, swizzle {self.swizzle})"
        )


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
