"""TMA tensor maps: the recipe a variant records for each tensor-map parameter.

A kernel whose host function builds TMA atoms takes each map as a 128-byte, 64-byte aligned
``CUtensorMap`` parameter. The compiler reads from the host function how the DSL encodes it
and records a :class:`TensorMap`: the operand tensor, the data type, the map's dims (elements,
innermost first) and strides (bytes) as expressions over the launch's input words, and the
constants (box, element strides, interleave, swizzle, L2 promotion, out-of-bounds fill). The
loader encodes it per call (``b12x_aot.loader._tensor_maps``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["MAP_ALIGN", "MAP_BYTES", "MAP_ELEMENT_BYTES", "TensorMap"]

MAP_BYTES = 128
MAP_ALIGN = 64
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
