"""The plain call of a variant with tensor arguments remembers what it packed per input words:
a repeated call launches the same bytes without deriving them again, any change of pointer,
shape or strides packs anew, and the ring of remembered sets evicts its oldest."""

from __future__ import annotations

import struct

import pytest

from b12x_aot.loader import LaunchArgumentError, PreparedLaunch, TensorView
from b12x_aot.loader._memo import SLOTS

from .test_tensor_launch import GEOMETRY, TENSOR, _entry

CLUSTER = {**GEOMETRY, "block": ["128", "1", "1"], "cluster": ["2", "1", "1"], "grid": ["2 * m", "1", "1"]}


def _words(driver, launch: PreparedLaunch) -> tuple[int, ...]:
    return struct.unpack_from(launch.layout.fmt, driver.params(launch.layout))


def test_a_repeated_call_launches_what_packing_anew_would(driver) -> None:
    launch = PreparedLaunch(_entry([TENSOR], GEOMETRY), 0, None, 0)
    views = [
        TensorView(1024, (3, 5), (8, 1)),
        TensorView(2048, (3, 5), (8, 1)),
        TensorView(1024, (4, 5), (8, 1)),
    ]
    views.append(TensorView(1024, (3, 5), (9, 1)))
    for view in (*views, *views):
        launch(view)
        assert _words(driver, launch) == (view.address, *view.shape, view.strides[0])
        assert driver.params(launch.layout) == launch.packed(view)
        assert driver.calls[-1][0] == (view.shape[0], 1, 1)


def test_a_hit_derives_nothing(driver, monkeypatch) -> None:
    launch = PreparedLaunch(_entry([TENSOR], GEOMETRY), 0, None, 0)
    view = TensorView(1024, (3, 5), (8, 1))
    launch(view)
    fills = []
    env = type(launch).__call__.__globals__
    original = env["fill"]
    monkeypatch.setitem(env, "fill", lambda *a: fills.append(a) or original(*a))
    launch(view)
    launch(TensorView(1024, (3, 5), (8, 1)))  # an equal record, another object
    assert fills == [] and len(driver.calls) == 3
    launch(TensorView(1024, (3, 6), (8, 1)))
    assert len(fills) == 1


def test_the_oldest_set_is_evicted_and_packed_again(driver) -> None:
    launch = PreparedLaunch(_entry([TENSOR], GEOMETRY), 0, None, 0)
    views = [TensorView(4096 * (i + 1), (2, 3), (4, 1)) for i in range(SLOTS + 3)]
    for view in views:
        launch(view)
    memo = type(launch).__call__.__globals__["recall"].__self__
    assert len(memo) == SLOTS and (views[0].address, (2, 3), (4, 1)) not in memo
    for view in views[:4]:
        launch(view)
        assert _words(driver, launch) == (view.address, 2, 3, 4)


def test_an_empty_grid_is_remembered_and_launches_nothing(driver) -> None:
    launch = PreparedLaunch(_entry([TENSOR], GEOMETRY), 0, None, 0)
    for _ in range(2):
        launch(TensorView(1024, (0, 5), (8, 1)))
    assert driver.calls == []


def test_a_failed_pack_leaves_nothing_behind(driver) -> None:
    launch_json = {**GEOMETRY, "params": [[4, 4, [[0, "i", "(m * n)"]]]]}
    launch = PreparedLaunch(_entry([TENSOR], launch_json), 0, None, 0)
    big = TensorView(0, (65536, 65536), (65536, 1))
    for _ in range(2):  # the second call fails the same way: no entry was kept for it
        with pytest.raises(LaunchArgumentError, match="do not pack"):
            launch(big)
    launch(TensorView(0, (3, 4), (4, 1)))
    assert struct.unpack_from("<i", driver.params(launch.layout)) == (12,)


def test_a_cluster_launch_sets_each_remembered_config_stream_when_it_changes(cluster_driver) -> None:
    launch = PreparedLaunch(_entry([TENSOR], CLUSTER), 0, None, 0)
    a, b = TensorView(1024, (3, 5), (8, 1)), TensorView(2048, (4, 5), (8, 1))
    for view, stream in ((a, 5), (a, 7), (b, 7), (a, 5), (b, 9), (a, 5)):
        launch(view, stream=stream)
    grids = [c[0] for c in cluster_driver.calls]
    assert grids == [(6, 1, 1), (6, 1, 1), (8, 1, 1), (6, 1, 1), (8, 1, 1), (6, 1, 1)]
    assert [c[3] for c in cluster_driver.calls] == [5, 7, 7, 5, 9, 5]
    assert {c[4] for c in cluster_driver.calls} == {(2, 1, 1)}
