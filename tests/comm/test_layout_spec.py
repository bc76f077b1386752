"""The comm.allreduce spec and the window layout agree: the ``ctrl`` shape is the whole window
the runtime allocates (the spec writes ``DATA_OFFSET`` out as a number, checked here), ``peers``
is one address per rank, and the params stay within the layout's flag rows and peer columns."""

from __future__ import annotations

import yaml

from b12x_aot.comm import WindowLayout
from b12x_aot.comm._policy import ABI
from b12x_aot.comm.layout import (
    DATA_OFFSET,
    FLAGS_OFFSET,
    MAX_BLOCKS,
    MAX_WORLD,
    PAGE_BYTES,
    PEERS_OFFSET,
    flag_offset,
)
from b12x_aot.compiler import expand, load_spec

from ..conftest import SPECS
from ..loader.test_checked_errors import entry_for


def spec_worlds() -> list[int]:
    return yaml.safe_load((SPECS / "comm_allreduce.yaml").read_text())["params"]["world"]


def test_ctrl_shape_is_the_window_the_runtime_allocates() -> None:
    for world in spec_worlds():
        entry = entry_for("comm_allreduce.yaml", {"world": world, "dtype": "bf16"})
        for capacity in (0, 8, 1024, 1536 * 7168):
            shapes = entry.shapes(rank=0, num_elements=0, capacity=capacity)
            assert shapes["ctrl"] == (WindowLayout(world, capacity * 2).bytes // 4,)
            assert shapes["peers"] == (world,)
        assert entry.shapes(rank=0, num_elements=0, capacity=0)["ctrl"] == (DATA_OFFSET // 4,)


def test_header_peers_and_flags_fit_below_a_page_aligned_data_offset() -> None:
    assert MAX_WORLD == 16
    assert PEERS_OFFSET + 8 * MAX_WORLD <= FLAGS_OFFSET
    last_flag = flag_offset(1, MAX_BLOCKS - 1, MAX_WORLD - 1)
    assert last_flag + 4 == FLAGS_OFFSET + 2 * MAX_BLOCKS * MAX_WORLD * 4 <= DATA_OFFSET
    assert DATA_OFFSET % PAGE_BYTES == 0 and DATA_OFFSET - (last_flag + 4) < PAGE_BYTES
    assert DATA_OFFSET == 12288


def test_params_fit_the_layout() -> None:
    spec = load_spec(SPECS / "comm_allreduce.yaml")
    assert spec.abi == ABI  # the runtime asks the registry for the spec's abi
    accepted = expand(spec).accepted
    assert {v.id.params["world"] for v in accepted} == {2, 3, 4, 5, 6, 7, 8, 9, 16}
    assert all(v.id.params["blocks"] <= MAX_BLOCKS and v.id.params["world"] <= MAX_WORLD for v in accepted)
    assert all(v.id.params["cta_threads"] >= v.id.params["world"] for v in accepted)
