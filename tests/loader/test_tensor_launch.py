"""Generated launch code over hand-made index entries: tensor words, recorded parameter words
that need the evaluator, and the refusals of ``checked`` (no cubin or GPU needed)."""

from __future__ import annotations

import json
import struct

import pytest

from b12x_aot.contract import Arg
from b12x_aot.loader import Buffer, LaunchArgumentError, PreparedLaunch, TensorView
from b12x_aot.loader._index import IndexEntry


def _entry(args: list[Arg], launch: dict, params: dict | None = None) -> IndexEntry:
    row = (
        "k" * 64,
        "t.made",
        1,
        "sm_90a",
        json.dumps(params or {}),
        "0" * 64,
        "kern",
        json.dumps([a.to_json() for a in args]),
        json.dumps(launch),
        None,
    )
    return IndexEntry(row)


GEOMETRY = {"grid": ["m", "1", "1"], "block": ["128", "1", "1"], "smem": "0", "cluster": None, "requires": []}
TENSOR = Arg("x", "tensor", "fp32", 4, "in", ("m", "n"), ("ld", "1"), (0, 1), (0,), (("ld", 4),))


def test_tensor_words_pack_from_torch_and_views(driver) -> None:
    torch = pytest.importorskip("torch")
    launch = PreparedLaunch(_entry([TENSOR], GEOMETRY), 0, None, 0)
    t = torch.zeros(6, 10)[:, :7]
    launch(t)
    assert struct.unpack_from(launch.layout.fmt, driver.params(launch.layout)) == (t.data_ptr(), 6, 7, 10)
    launch.checked(TensorView(1024, (3, 5), (8, 1)))
    assert struct.unpack_from(launch.layout.fmt, driver.params(launch.layout)) == (1024, 3, 5, 8)
    assert driver.calls[-1][0] == (3, 1, 1)


def test_a_recorded_word_that_needs_the_evaluator_packs_in_the_plain_call(driver) -> None:
    # a runtime shift count is not written inline (it is checked): the closure reads ``A``
    launch_json = {**GEOMETRY, "params": [[8, 4, [[0, "i", "m"], [4, "i", "(m << n)"]]]]}
    launch = PreparedLaunch(_entry([TENSOR], launch_json), 0, None, 0)
    launch(TensorView(0, (3, 2), (4, 1)))
    assert struct.unpack_from("<ii", driver.params(launch.layout)) == (3, 12)
    launch.checked(TensorView(0, (5, 1), (4, 1)))
    assert struct.unpack_from("<ii", driver.params(launch.layout)) == (5, 10)


def test_a_word_too_wide_for_its_slot_is_a_launch_argument_error(driver) -> None:
    launch_json = {**GEOMETRY, "params": [[4, 4, [[0, "i", "(m * n)"]]]]}
    launch = PreparedLaunch(_entry([TENSOR], launch_json), 0, None, 0)
    big = TensorView(0, (65536, 65536), (65536, 1))
    for call in (launch, launch.checked):
        with pytest.raises(LaunchArgumentError, match="do not pack"):
            call(big)


def test_u64_scalars_and_pointers_each_read_their_own_word(driver) -> None:
    args = [Arg("p", "ptr", "fp32", 16, "in", ("m",)), Arg("n", "u64"), Arg("m", "i32")]
    launch = PreparedLaunch(_entry(args, GEOMETRY), 0, None, 0)
    launch.checked(Buffer(1 << 32, 64), (1 << 64) - 1, 3)
    assert struct.unpack_from(launch.layout.fmt, driver.params(launch.layout)) == (1 << 32, (1 << 64) - 1, 3)


def test_requirements_are_checked_in_order_and_name_the_symbols(driver) -> None:
    launch_json = {**GEOMETRY, "requires": ["n > 0", "64 % n == 0", "m * n < 100"]}
    launch = PreparedLaunch(_entry([TENSOR], launch_json), 0, None, 0)
    with pytest.raises(
        LaunchArgumentError, match=r"break the launch requirement 'n > 0' \(got m=4, n=0, ld=0\)"
    ):
        launch.checked(TensorView(0, (4, 0), (0, 1)))
    with pytest.raises(LaunchArgumentError, match=r"'m \* n < 100' \(got m=50, n=4, ld=4\)"):
        launch.checked(TensorView(0, (50, 4), (4, 1)))
