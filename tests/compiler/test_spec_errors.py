"""Spec errors name the file, the line and the field, and never show a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from b12x_aot.compiler._spec import load_spec, load_specs
from b12x_aot.compiler.errors import SpecError

from ..conftest import TOPK_SMALL, write_spec


def faults(tmp_path: Path, text: str) -> str:
    path = write_spec(tmp_path, "bad.yaml", text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return str(err.value)


def line_of(text: str, needle: str) -> int:
    for i, line in enumerate(text.lstrip().splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


def test_wrong_type_names_file_line_field(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace("abi: 1", 'abi: "one"')
    msg = faults(tmp_path, text)
    assert f"bad.yaml:{line_of(text, 'abi:')}: abi: Input should be a valid integer" in msg
    assert "(got 'one')" in msg


def test_unknown_key(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace("launch:", "lauch: {}\nlaunch:")
    msg = faults(tmp_path, text)
    assert f"bad.yaml:{line_of(text, 'lauch:')}: lauch: Extra inputs are not permitted" in msg


def test_unknown_key_inside_an_arg(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace("align: 4,", "align: 4, aligned: 8,", 1)
    msg = faults(tmp_path, text)
    assert f":{line_of(text, 'aligned')}: args[2].aligned: Extra inputs are not permitted" in msg


def test_bad_expression(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace('"cdiv(hidden, cta_threads * 8)"', '"hidden / cta_threads"')
    msg = faults(tmp_path, text)
    assert f":{line_of(text, 'grid:')}: launch.grid[1]: bad expression 'hidden / cta_threads'" in msg
    assert "use // for integer division" in msg


def test_expression_reading_an_unknown_name(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace('block: ["cta_threads", 1, 1]', 'block: ["num_tokens", 1, 1]')
    msg = faults(tmp_path, text)
    assert "launch.block[0]: expression 'num_tokens' reads num_tokens, which is not among" in msg


def test_invalid_arg_dtype(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace("dtype: fp32,        align: 4", "dtype: f33, align: 4")
    msg = faults(tmp_path, text)
    assert f":{line_of(text, 'f33')}: args[2].dtype: 'f33' is not a dtype; valid: fp64, fp32" in msg


def test_template_param_with_non_dtype_values(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace('dtype: "{output}"', 'dtype: "{topk}"')
    msg = faults(tmp_path, text)
    assert "args[0].dtype: param 'topk' has values that are not dtypes: [2]" in msg


def test_every_fault_is_reported_at_once(tmp_path: Path) -> None:
    text = TOPK_SMALL.replace("sm_120a", "sm_121x").replace("dtype: i32,", "dtype: int32,")
    msg = faults(tmp_path, text)
    assert "archs[2]: unknown arch 'sm_121x'" in msg
    assert "args[3].dtype: 'int32' is not a dtype" in msg


def test_invalid_yaml(tmp_path: Path) -> None:
    msg = faults(tmp_path, "family: [unclosed\n")
    assert "bad.yaml:" in msg and "invalid YAML" in msg


def test_duplicate_family_across_files(tmp_path: Path) -> None:
    write_spec(tmp_path, "a.yaml", TOPK_SMALL)
    write_spec(tmp_path, "b.yaml", TOPK_SMALL)
    with pytest.raises(SpecError, match="is also defined in"):
        load_specs([tmp_path])


def test_a_file_named_twice_loads_once(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "a.yaml", TOPK_SMALL)
    specs = load_specs([tmp_path, path, tmp_path / "." / "a.yaml"])
    assert [s.path for s in specs] == [path]


def test_a_spec_that_is_not_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(TOPK_SMALL.replace("family:", "# caf\xe9\nfamily:", 1).encode("latin-1"))
    with pytest.raises(
        SpecError, match=r"latin1\.yaml:\d+: not UTF-8 text \(byte \d+: invalid continuation byte\)"
    ):
        load_spec(path)


def test_cli_shows_message_not_traceback(tmp_path: Path, cli) -> None:
    from b12x_aot.compiler.cli import main

    write_spec(tmp_path, "bad.yaml", TOPK_SMALL.replace("abi: 1", "abi: -1"))
    result = cli.invoke(main, [str(tmp_path), "--registry", str(tmp_path / "r.db"), "--dry-run"])
    assert result.exit_code == 2
    assert "bad.yaml:2: abi: Input should be greater than or equal to 1" in result.output
    assert "Traceback" not in result.output
