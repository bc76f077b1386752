"""Tensor-map parameters at launch, over hand-made index entries: the recipe reaches
``cuTensorMapEncodeTiled`` with the call's values, an encoding is kept per (address, dims,
strides), the bytes land at the parameter's offset, and what TMA cannot address is refused
naming the tensor (the driver's encoder is recorded, so no GPU is needed)."""

from __future__ import annotations

import struct

import pytest

from b12x_aot.contract import Arg, TensorMap
from b12x_aot.loader import LaunchArgumentError, PreparedLaunch, TensorView

from .conftest import RecordingEncoder
from .test_tensor_launch import _entry

A = Arg("a", "tensor", "fp16", 2, "in", ("m", "k"), ("lda", "1"), (0, 1), (0,), ())
MAP = TensorMap("a", 6, ("k", "m"), ("lda * 2",), (64, 128), (1, 1), 0, 3, 2, 0)
GEOMETRY = {
    "grid": ["cdiv(m, 128)", "1", "1"],
    "block": ["128", "1", "1"],
    "smem": "0",
    "cluster": None,
    "requires": [],
    "params": [[128, 64, [], MAP.to_json()], [8, 4, [[0, "i", "m"], [4, "i", "k"]]]],
}


def _map_words(driver, launch: PreparedLaunch) -> tuple[int, ...]:
    offset = launch.layout.offsets[0]
    return struct.unpack_from("<16Q", driver.params(launch.layout), offset)


def test_the_map_is_encoded_from_the_call_and_kept(driver, encoder) -> None:
    launch = PreparedLaunch(_entry([A], GEOMETRY), 0, None, 0)
    assert launch.layout.offsets == (48, 176)  # sm_90a's bank starts 16 B past a 64-byte line
    view = TensorView(1 << 20, (300, 520), (528, 1))
    launch(view)
    assert encoder.calls == [(6, 2, 1 << 20, [520, 300], [1056], [64, 128], [1, 1], (0, 3, 2, 0))]
    assert _map_words(driver, launch)[:4] == (1 << 20, 520, 300, 1)
    assert struct.unpack_from("<ii", driver.params(launch.layout), 176) == (300, 520)
    launch(view)
    launch.checked(view)
    assert len(encoder.calls) == 1  # same address, dims and strides: nothing encoded again
    launch(TensorView(1 << 21, (300, 520), (528, 1)))
    launch(TensorView(1 << 20, (301, 520), (528, 1)))
    assert [c[2:4] for c in encoder.calls[1:]] == [(1 << 21, [520, 300]), (1 << 20, [520, 301])]
    assert _map_words(driver, launch)[:4] == (1 << 20, 520, 301, 3)
    assert [c[0] for c in driver.calls] == [(3, 1, 1)] * 5


def test_an_empty_tensor_has_an_empty_map(driver, encoder) -> None:
    launch = PreparedLaunch(_entry([A], GEOMETRY), 0, None, 0)
    launch(TensorView(1 << 20, (0, 520), (528, 1)))
    assert encoder.calls == [] and driver.calls == []  # no encoding, and an empty grid
    launch(TensorView(1 << 20, (5, 0), (8, 1)))
    assert encoder.calls == [] and _map_words(driver, launch) == (0,) * 16
    assert len(driver.calls) == 1


@pytest.mark.parametrize(
    ("view", "problem"),
    [
        (TensorView((1 << 20) + 2, (8, 8), (8, 1)), "data pointer 0x100002 must be 16-byte aligned for TMA"),
        (
            TensorView(1 << 20, (8, 8), (12, 1)),
            r"TMA stride 1 \(lda \* 2 = 24 B\) must be a positive multiple of 16",
        ),
    ],
)
def test_what_tma_cannot_address_is_refused_naming_the_tensor(driver, encoder, view, problem) -> None:
    launch = PreparedLaunch(_entry([A], GEOMETRY), 0, None, 0)
    for call in (launch, launch.checked):
        with pytest.raises(LaunchArgumentError, match=problem) as info:
            call(view)
        assert info.value.arg == "a"
    assert encoder.calls == [] and driver.calls == []


def test_a_driver_refusal_names_the_tensor(driver, monkeypatch) -> None:
    from cuda.bindings import driver as cu

    monkeypatch.setattr(cu, "cuTensorMapEncodeTiled", RecordingEncoder("CUDA_ERROR_INVALID_VALUE"))
    launch = PreparedLaunch(_entry([A], GEOMETRY), 0, None, 0)
    with pytest.raises(
        LaunchArgumentError, match=r"cuTensorMapEncodeTiled refused it \(CUDA_ERROR_INVALID_VALUE\)"
    ) as info:
        launch.checked(TensorView(1 << 20, (8, 8), (8, 1)))
    assert info.value.arg == "a" and driver.calls == []


def test_a_map_round_trips_through_json() -> None:
    assert TensorMap.from_json(MAP.to_json()) == MAP
