"""A spec table that cannot be read is a fault at its entry, naming the table file's line."""

from __future__ import annotations

from pathlib import Path

import pytest

from b12x_aot.compiler._spec import load_spec
from b12x_aot.compiler.errors import SpecError

from ..conftest import TOPK_SMALL, write_spec

GOOD = "params: [cta_threads, output]\ntiles:\n  all:\n    - [128, fp32]\n    - [256, bf16]\n"


def _faults(tmp_path: Path, table: str | None, entry: str = "{file: t.yaml, columns: [cta_threads]}") -> str:
    if table is not None:
        (tmp_path / "t.yaml").write_text(table)
    text = TOPK_SMALL.replace(
        'constraints: ["hidden % (cta_threads * 8) == 0"]',
        f'tables:\n  threads: {entry}\nconstraints: ["(cta_threads,) in threads"]',
    )
    with pytest.raises(SpecError) as err:
        load_spec(write_spec(tmp_path, "s.yaml", text))
    return str(err.value)


@pytest.mark.parametrize(
    ("table", "match"),
    [
        (None, "tables.threads.file: t.yaml:0: cannot read the file"),
        ("tiles: [unclosed\n", "tables.threads.file: t.yaml:2: invalid YAML"),
        ("- 1\n", "t.yaml:1: must be a mapping with params (a list of names) and tiles"),
        (
            "params: cta_threads\ntiles: {a: [[128]]}\n",
            "t.yaml:1: params must list the names of a row's values",
        ),
        (GOOD.replace("output]", "outputs]"), "t.yaml:1: names outputs, which this spec has no param of"),
        (GOOD.replace("[128, fp32]", "[128]"), "t.yaml:4: row [128] has 1 values; params names 2"),
        (
            GOOD.replace("[256, bf16]", "[512, bf16]"),
            "t.yaml:5: row [512, 'bf16'] has cta_threads=512, which",
        ),
        (
            GOOD.replace("[256, bf16]", "[256, fp16]"),
            "has output='fp16', which the spec's params.output does not list",
        ),
        (
            GOOD.replace("[256, bf16]", "[256, [bf16]]"),
            "t.yaml:5: tiles.all[1] must be a row of values or a list",
        ),
        (
            GOOD.replace("  all:\n    - [128, fp32]\n    - [256, bf16]\n", "  all: []\n"),
            "tiles.all must be a non-empty list",
        ),
    ],
)
def test_a_table_file_that_is_not_a_table_is_a_fault_at_its_line(tmp_path: Path, table, match: str) -> None:
    msg = _faults(tmp_path, table)
    assert match in msg, msg
    assert "s.yaml:" in msg and "tables.threads" in msg
    assert "reads threads, which is not among" not in msg  # the constraint naming it adds no fault


def test_a_column_the_table_lacks_or_names_twice(tmp_path: Path) -> None:
    msg = _faults(
        tmp_path,
        GOOD.replace("cta_threads, output", "output, hidden")
        .replace("128, fp32", "fp32, 2048")
        .replace("256, bf16", "bf16, 2048"),
    )
    assert "its params do not name the column(s) cta_threads" in msg
    msg = _faults(tmp_path, GOOD, "{file: t.yaml, columns: [cta_threads, cta_threads]}")
    assert "tables.threads.columns: lists a param twice" in msg


@pytest.mark.parametrize("name", ["hidden", "arch", "two__parts"])
def test_a_table_may_not_take_a_param_name(tmp_path: Path, name: str) -> None:
    (tmp_path / "t.yaml").write_text(GOOD)
    text = TOPK_SMALL.replace(
        'constraints: ["hidden % (cta_threads * 8) == 0"]',
        f"tables:\n  {name}: {{file: t.yaml, columns: [cta_threads]}}\n",
    )
    with pytest.raises(
        SpecError, match=f"tables.{name}: must be an identifier without '__' that names no param"
    ):
        load_spec(write_spec(tmp_path, "s.yaml", text))


def test_an_unknown_table_name_in_a_constraint_is_the_usual_fault(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(GOOD)
    text = TOPK_SMALL.replace(
        'constraints: ["hidden % (cta_threads * 8) == 0"]',
        'tables:\n  threads: {file: t.yaml, columns: [cta_threads]}\nconstraints: ["(cta_threads,) in thread"]',
    )
    with pytest.raises(SpecError, match=r"reads thread, which is not among: .*threads"):
        load_spec(write_spec(tmp_path, "s.yaml", text))
