"""Spec tables: a constraint reads a set of param tuples from a tile table file, the one the
family's op reads, so the build set follows the op's tiles without restating them."""

from __future__ import annotations

from pathlib import Path

from b12x_aot.compiler._spec import load_spec
from b12x_aot.compiler._variants import expand

from ..conftest import SPECS, TOPK_SMALL, write_spec

TABLE = """
# tiles by regime; the keys besides params and tiles are the op's
params: [cta_threads, output]
tiles:
  wide: &wide
    - [256, bf16]
  narrow:
    - [128, fp32]
    - *wide
    - [128, fp32]
threshold: 3
"""

WITH_TABLE = TOPK_SMALL.replace(
    'constraints: ["hidden % (cta_threads * 8) == 0"]',
    "tables:\n"
    "  threads: {file: tiles/t.yaml, columns: [cta_threads]}\n"
    "  pairs: {file: tiles/t.yaml, columns: [output, cta_threads]}\n"
    'constraints: ["hidden % (cta_threads * 8) == 0", "(output, cta_threads) in pairs", "(cta_threads,) in threads"]',
)


def test_a_table_becomes_the_tuple_literal_of_its_columns(tmp_path: Path) -> None:
    (tmp_path / "tiles").mkdir()
    write_spec(tmp_path / "tiles", "t.yaml", TABLE)
    spec = load_spec(write_spec(tmp_path, "s.yaml", WITH_TABLE))
    # distinct rows in the file's order, first seen first (an aliased list spliced in)
    assert [c.source for c in spec.constraints[1:]] == [
        "(output, cta_threads) in (('bf16', 256), ('fp32', 128))",
        "(cta_threads,) in ((256,), (128,))",
    ]
    built = {(v.id.params["output"], v.id.params["cta_threads"]) for v in expand(spec).accepted}
    assert built == {("fp32", 128), ("bf16", 256)}


def test_the_w4a16_spec_builds_every_op_tile_shape_and_only_those() -> None:
    # The spec's tile constraints read the op's table: the (tile, k_ctas) pairs it builds are
    # exactly the table's, on the long-k shapes where every tile fits.
    from b12x_aot.compiler._spec_tables import _read_rows

    spec = load_spec(SPECS / "moe_w4a16.yaml")
    columns = ("block_m", "tile_n", "tile_k", "stages", "cta_threads", "split_k", "k_ctas")
    rows = set(_read_rows(SPECS.parent / "ops" / "moe_w4a16_tiles.yaml", columns, dict(spec.params)))
    built = {tuple(v.id.params[c] for c in columns) for v in expand(spec, archs=["sm_90a"]).accepted}
    assert built == rows
