"""A tile table the moe_w4a16 op cannot read is refused when it is read, naming what is wrong."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from b12x_aot.contract import B12xError
from b12x_aot.ops.errors import TileTableError
from b12x_aot.ops.moe_w4a16_tiles import SHIPPED, W4A16Tiles, shipped_tiles


def _data() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(SHIPPED.read_text())


def test_the_shipped_table_reads_and_splices_aliased_lists() -> None:
    table = shipped_tiles()
    assert table.source == str(SHIPPED)
    tiny = table.regimes["tiny"]
    assert table.regimes["cluster4"][2:] == tiny and table.regimes["resident"][1:] == tiny
    assert table.regimes["decode"][-3:] == tiny[-3:]  # the one-part tiles close both
    assert all(len(t) == len(table.params) for tiles in table.regimes.values() for t in tiles)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.pop("tail_share"), "must be a mapping of exactly params, tiles"),
        (lambda d: d.update(extra=1), r"must be a mapping of exactly .*\(got \[.*'extra'"),
        (lambda d: d["tiles"].pop("mid"), "regime.s. mid have no tiles"),
        (lambda d: d["decode_bands"].append(["wide", 9.0]), "regime.s. wide have no tiles"),
        (lambda d: d["tiles"]["mid"][0].pop(), "a tile of 'mid' has 9 values, params names 10"),
        (lambda d: d["tiles"].update(mid=[]), "regime 'mid' lists no tile"),
        (lambda d: d["decode_bands"].reverse(), "decode_bands' bounds must increase"),
        (lambda d: d.update(tail_share=2), "tail_share is a share of experts, 0 to 1"),
        (lambda d: d.update(decode_tokens=300), "needs 0 <= decode_tokens <= prefill_tokens"),
        (lambda d: d.update(params=[*d["params"][:-1], "block_m"]), "params must name each value once"),
        (lambda d: d.update(route_pack=[1, 2]), "a value of the wrong shape"),
    ],
)
def test_a_malformed_table_is_refused_naming_the_problem(change, match: str) -> None:
    data = _data()
    change(data)
    with pytest.raises(TileTableError, match=match) as refused:
        W4A16Tiles.from_data(data, "mine.yaml")
    assert isinstance(refused.value, B12xError)
    assert str(refused.value).startswith("tile table mine.yaml: ")


def test_a_table_without_the_riding_params_is_refused() -> None:
    table = shipped_tiles()
    params = tuple("rows" if p == "tail_rows" else p for p in table.params)
    with pytest.raises(TileTableError, match="params must name block_m and tail_rows"):
        dataclasses.replace(table, params=params)


def test_a_table_file_that_is_not_yaml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "tiles.yaml"
    bad.write_text("tiles: [unclosed\n")
    with pytest.raises(TileTableError, match=re.escape(f"tile table {bad}: invalid YAML")):
        W4A16Tiles.read(bad)
    good = tmp_path / "good.yaml"
    good.write_text(SHIPPED.read_text())
    assert W4A16Tiles.read(good).regimes == shipped_tiles().regimes
