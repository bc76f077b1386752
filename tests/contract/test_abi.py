from __future__ import annotations

import struct

import pytest

from b12x_aot.contract import Arg, ParamLayout, default_params


def test_natural_alignment_and_padding() -> None:
    args = [
        Arg("a", "ptr", "fp32", 16),
        Arg("n", "i32"),
        Arg("b", "ptr", "bf16", 16),
        Arg("x", "f32"),
        Arg("y", "i64"),
    ]
    layout = ParamLayout.of(default_params(args, {}))
    assert layout.offsets == (0, 8, 16, 24, 32)
    assert layout.sizes == (8, 4, 8, 4, 8)
    assert layout.size == 40
    assert struct.calcsize(layout.fmt) == 40
    buf = bytearray(layout.size)
    struct.pack_into(layout.fmt, buf, 0, 0x1122, 7, 0x3344, 1.5, -2)
    assert struct.unpack_from("<Q", buf, 16)[0] == 0x3344
    assert struct.unpack_from("<i", buf, 8)[0] == 7
    assert struct.unpack_from("<q", buf, 32)[0] == -2


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"name": "p", "kind": "ptr", "dtype": "f33", "align": 16}, "'f33' is not a dtype"),
        ({"name": "p", "kind": "ptr", "dtype": "fp32", "align": 12}, "power of two"),
        ({"name": "p", "kind": "ptr", "dtype": "fp32", "align": 2}, "below the fp32 item size"),
        ({"name": "n", "kind": "i32", "dtype": "fp32"}, "takes no dtype"),
        ({"name": "n", "kind": "i128"}, "kind: must be one of"),
        ({"name": "not ok", "kind": "i32"}, "identifier"),
        ({"name": "p", "kind": "ptr", "dtype": "fp32", "align": 4, "intent": "write"}, "intent"),
    ],
)
def test_arg_validation(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        Arg(**kwargs)


def test_arg_json_round_trip() -> None:
    for arg in (Arg("out", "ptr", "bf16", 16, "out"), Arg("n", "u64")):
        assert Arg.from_json(arg.to_json()) == arg
