"""The comm.allreduce spec and the window layout agree: the ``ctrl`` shape is the whole window
the runtime allocates, ``peers`` is one address per rank, and the params stay within the
layout's flag rows and peer columns."""

from __future__ import annotations

from b12x_aot.comm import WindowLayout
from b12x_aot.comm.layout import MAX_BLOCKS, MAX_WORLD
from b12x_aot.compiler import expand, load_spec

from ..conftest import SPECS
from ..loader.test_checked_errors import entry_for


def test_ctrl_shape_is_the_window_the_runtime_allocates() -> None:
    for world in (2, 4, 8):
        entry = entry_for("comm_allreduce.yaml", {"world": world, "dtype": "bf16"})
        for capacity in (8, 1024, 1536 * 7168):
            shapes = entry.shapes(rank=0, num_elements=0, capacity=capacity)
            assert shapes["ctrl"] == (WindowLayout(world, capacity * 2).bytes // 4,)
            assert shapes["peers"] == (world,)


def test_params_fit_the_layout() -> None:
    spec = load_spec(SPECS / "comm_allreduce.yaml")
    accepted = expand(spec).accepted
    assert accepted
    assert all(v.id.params["blocks"] <= MAX_BLOCKS and v.id.params["world"] <= MAX_WORLD for v in accepted)
