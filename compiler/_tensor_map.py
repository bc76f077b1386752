"""A TMA tensor map's recipe, read from the descriptor words the DSL's host code computes.

``cpasync.make_tiled_tma_atom`` lowers (in the DSL's ``cute-expand-ops``) straight to integer
arithmetic that fills a 16 x i64 ``CUtensorMap`` from the tensor's pointer, shape and stride
words; no op along the way names the fields. So the compiler reads the words as terms
(``_host_launch``), evaluates them at sample inputs, and decodes the fields from the sm_90
descriptor layout below: data type, rank, dims, byte strides, box, element strides,
swizzle, L2 promotion and out-of-bounds fill. Each dim and stride must be one of the launch's
input words (a stride times the element size) or a constant; the address must be a tensor
argument's data pointer. The recipe is then re-encoded at more samples and must give the
DSL's words back, bit for bit, outside two bits of word 1 that the DSL sets and the driver's
own encoding leaves clear (bit 1, and bit 21 for a tensor spanning at least 128 KiB). A
descriptor this cannot account for is refused, never approximated. The loader encodes the
recipe with ``cuTensorMapEncodeTiled`` (``loader/_tensor_maps``).

Word layout (bit positions; dims and boxes are stored minus one, strides shifted right by 4):
w0 address[4:57]; w1 rank-1 at 4, data type at 7, swizzle at 13, OOB fill at 15, tf32 at 16,
L2 promotion at 17, stride 1 at 32; w2 strides 2 and 3; w3 stride 4, then bits 32-35 of each
stride at 32 + 4(i-1); w4, w5, w6 dims 0-4 (32 bits each); w6 element strides at 32 + 3i, box
0 at 56; w7 boxes 1-4 (8 bits each). Words 8-15 are not written by the DSL.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from b12x_aot.contract import MAP_ELEMENT_BYTES, Arg, InputWord, TensorMap

from ._host_launch import LaunchParam
from ._samples import sample_inputs
from ._terms import evaluate
from .errors import ContractError

__all__ = ["MAP_TYPE", "read_tensor_map"]

MAP_TYPE = "!llvm.struct<(struct<(array<16 x i64>)>)>"
_M32 = (1 << 32) - 1
_M64 = (1 << 64) - 1
_DSL_ONLY = (1 << 1) | (1 << 21)  # word 1 bits the DSL sets and the driver does not
_DECODE_SAMPLES = 8
_CHECK_SAMPLES = 64
_SIZES = tuple(range(1, 4097))
# the descriptor's data type code -> CUtensorMapDataType (tf32 is f32's code with its own bit)
_DTYPES = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 10, 9: 8, 10: 9}
_TF32 = {7: 11, 8: 12}
_CONSTANT = ("rank", "code", "swizzle", "oob_fill", "tf32", "l2_promotion", "box", "element_strides")


def _fields(w: Sequence[int]) -> dict[str, Any]:
    rank = ((w[1] >> 4) & 7) + 1
    low = [(w[1] >> 32) & _M32, w[2] & _M32, (w[2] >> 32) & _M32, w[3] & _M32]
    high = [(w[3] >> (32 + 4 * i)) & 15 for i in range(4)]
    dims = [w[4] & _M32, (w[4] >> 32) & _M32, w[5] & _M32, (w[5] >> 32) & _M32, w[6] & _M32]
    boxes = [(w[6] >> 56) & 0xFF] + [(w[7] >> (8 * i)) & 0xFF for i in range(4)]
    return {
        "address": w[0] & ~15 & ((1 << 57) - 1),
        "rank": rank,
        "code": (w[1] >> 7) & 15,
        "swizzle": (w[1] >> 13) & 3,
        "oob_fill": (w[1] >> 15) & 1,
        "tf32": (w[1] >> 16) & 1,
        "l2_promotion": (w[1] >> 17) & 3,
        "strides": [(low[i] | high[i] << 32) << 4 for i in range(rank - 1)],
        "dims": [d + 1 for d in dims[:rank]],
        "element_strides": [((w[6] >> (32 + 3 * i)) & 7) + 1 for i in range(rank)],
        "box": [b + 1 for b in boxes[:rank]],
    }


def _words(f: Mapping[str, Any]) -> list[int]:
    """The descriptor words of ``f`` (the inverse of :func:`_fields`, without the DSL-only bits)."""
    rank = f["rank"]
    strides = [s >> 4 for s in f["strides"]] + [0] * (5 - rank)
    dims = [d - 1 for d in f["dims"]] + [0] * (5 - rank)
    boxes = [b - 1 for b in f["box"]] + [0] * (5 - rank)
    w = [0] * 8
    w[0] = f["address"]
    w[1] = (
        (rank - 1) << 4
        | f["code"] << 7
        | f["swizzle"] << 13
        | f["oob_fill"] << 15
        | f["tf32"] << 16
        | f["l2_promotion"] << 17
        | (strides[0] & _M32) << 32
    )
    w[2] = (strides[1] & _M32) | (strides[2] & _M32) << 32
    w[3] = strides[3] & _M32
    for i in range(4):
        w[3] |= ((strides[i] >> 32) & 15) << (32 + 4 * i)
    w[4] = (dims[0] & _M32) | (dims[1] & _M32) << 32
    w[5] = (dims[2] & _M32) | (dims[3] & _M32) << 32
    w[6] = (dims[4] & _M32) | boxes[0] << 56
    for i, e in enumerate(f["element_strides"]):
        w[6] |= (e - 1) << (32 + 3 * i)
    w[7] = boxes[1] | boxes[2] << 8 | boxes[3] << 16 | boxes[4] << 24
    return w


def _value_of(source: str, env: Mapping[str, Any]) -> int:
    name, _, scale = source.partition(" * ")
    value = int(name) if name.isdigit() else env[name]
    return value * int(scale) if scale else value


def _match(
    values: Sequence[int], envs: Sequence[Mapping[str, Any]], names: Sequence[str], scale: int
) -> str | None:
    """The input word (times ``scale``) or the constant that gives ``values`` at every sample."""
    for name in names:
        if all(v == e[name] * scale for v, e in zip(values, envs, strict=True)):
            return name if scale == 1 else f"{name} * {scale}"
    return str(values[0]) if len(set(values)) == 1 else None


class _Reader:
    """One tensor-map parameter's words, evaluated at sample inputs of the spec."""

    def __init__(
        self,
        param: LaunchParam,
        ordinal: int,
        args: Sequence[Arg],
        inputs: Mapping[str, InputWord],
        params: Mapping[str, Any],
    ) -> None:
        self.ordinal = ordinal
        self.terms = param.words[:8]
        if any(t is None for t in self.terms):
            raise self.error("the host function leaves one of its first 8 words unset")
        self.inputs = inputs
        rng = random.Random(ordinal)
        words = list(inputs.values())

        def draw(rng: random.Random) -> int:
            return rng.randrange(1 << 28, 1 << 43) << 4

        self.envs = [
            sample_inputs(args, words, params, rng, _SIZES, address=draw, stride_unit=16)
            for _ in range(_DECODE_SAMPLES + _CHECK_SAMPLES)
        ]

    def error(self, problem: str) -> ContractError:
        return ContractError(f"kernel parameter {self.ordinal} (a TMA tensor map): {problem}")

    def words(self, env: Mapping[str, Any]) -> list[int]:
        try:
            return [int(evaluate(t, env)) & _M64 for t in self.terms]  # type: ignore[arg-type]
        except (ArithmeticError, KeyError) as exc:
            raise self.error(f"its words cannot be evaluated from the arguments ({exc!r})") from None

    def recipe(self) -> TensorMap:
        envs = self.envs[:_DECODE_SAMPLES]
        decoded = [_fields(self.words(e)) for e in envs]
        first = decoded[0]
        for name in _CONSTANT:
            if any(f[name] != first[name] for f in decoded):
                raise self.error(f"its {name} changes with the arguments")
        code = _TF32.get(first["code"]) if first["tf32"] else _DTYPES.get(first["code"])
        if code is None:
            raise self.error(f"data type code {first['code']} is not one the loader encodes")
        tensors = [w.name for w in self.inputs.values() if w.part == "data"]
        address = _match([f["address"] for f in decoded], envs, tensors, 1)
        if address is None or address.isdigit():
            raise self.error("its address is not a tensor argument's data pointer")
        owner = self.inputs[address].arg
        extents = [
            w.name
            for w in self.inputs.values()
            if w.part == "value" or (w.part == "shape" and w.arg == owner)
        ]
        strides = [w.name for w in self.inputs.values() if w.part == "stride" and w.arg == owner]
        element = MAP_ELEMENT_BYTES[code]
        dims = [_match([f["dims"][i] for f in decoded], envs, extents, 1) for i in range(first["rank"])]
        steps = [
            _match([f["strides"][i] for f in decoded], envs, strides, element)
            for i in range(first["rank"] - 1)
        ]
        for kind, found, offset in (("dim", dims, 0), ("stride", steps, 1)):
            if None in found:
                raise self.error(
                    f"its {kind} {found.index(None) + offset} is neither the tensor's "
                    f"{'extent' if kind == 'dim' else 'stride'} nor a constant; the loader cannot compute it"
                )
        self.constants = {k: first[k] for k in _CONSTANT}
        return TensorMap(
            tensor=address,
            dtype=code,
            dims=tuple(str(d) for d in dims),
            strides=tuple(str(s) for s in steps),
            box=tuple(first["box"]),
            element_strides=tuple(first["element_strides"]),
            interleave=0,  # a field the DSL never sets: the check below holds its bits to zero
            swizzle=first["swizzle"],
            l2_promotion=first["l2_promotion"],
            oob_fill=first["oob_fill"],
        )

    def check(self, tmap: TensorMap) -> None:
        """The recipe gives the DSL's words back at every check sample."""
        for env in self.envs[_DECODE_SAMPLES:]:
            fields = dict(
                self.constants,
                address=env[tmap.tensor],
                dims=[_value_of(d, env) for d in tmap.dims],
                strides=[_value_of(s, env) for s in tmap.strides],
            )
            want = self.words(env)
            want[1] &= ~_DSL_ONLY
            if _words(fields) != want:
                runtime = ", ".join(f"{n}={env[n]}" for n in self.inputs)
                raise self.error(
                    f"the recipe {tmap.describe()} does not reproduce the DSL's descriptor at {runtime}; "
                    "its encoding holds something this compiler does not read"
                )


def read_tensor_map(
    param: LaunchParam,
    ordinal: int,
    args: Sequence[Arg],
    inputs: Mapping[str, InputWord],
    params: Mapping[str, Any],
) -> TensorMap:
    """The recipe of a kernel parameter of :data:`MAP_TYPE`; raises :class:`ContractError`
    for a descriptor the loader could not encode alike."""
    reader = _Reader(param, ordinal, args, inputs, params)
    tmap = reader.recipe()
    reader.check(tmap)
    return tmap
