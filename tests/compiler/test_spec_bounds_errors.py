"""Hostile spec input is refused at load with exit 2, the file, the line and the reason: alias
bombs, files past the size bound, Python tags, expressions that never evaluate, expressions
past the language's bounds; never a traceback, a MemoryError or minutes of work."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from b12x_aot.compiler import cli
from b12x_aot.compiler._spec import load_spec
from b12x_aot.compiler.errors import SpecError
from b12x_aot.registry import _yaml as bounds

from ..conftest import ONE_VARIANT, write_spec


def refused(tmp_path: Path, text: str) -> str:
    path = write_spec(tmp_path, "bad.yaml", text)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return str(err.value)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.lstrip().splitlines(), 1) if needle in line)


def bomb(levels: int) -> str:
    rows = ["x_defs:", '  l0: &a0 ["lol"]']
    rows += [f"  l{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(rows) + "\n"


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    """Nine levels of nine aliases: refused at the first level past the bound, not expanded
    (the spec's line map would otherwise hold 387 million paths)."""
    text = ONE_VARIANT.lstrip() + bomb(9)
    msg = refused(tmp_path, text)
    assert f"bad.yaml:{line_of(text, 'l5:')}: this value expands to 125,479 values" in msg
    assert "use fewer aliases" in msg


def test_a_spec_past_the_size_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "MAX_BYTES", 256)
    msg = refused(tmp_path, ONE_VARIANT)
    assert msg.startswith(f"{tmp_path / 'bad.yaml'}: the file is larger than 0 KiB")


def test_a_python_tag_is_a_fault_at_its_line(tmp_path: Path) -> None:
    text = ONE_VARIANT.replace("family: moe.topk_sum", 'family: !!python/name:os.system ""')
    msg = refused(tmp_path, text)
    assert f"bad.yaml:{line_of(text, 'family:')}: invalid YAML: could not determine a constructor" in msg
    assert "remove the tag" in msg


def test_a_block_expression_of_the_wrong_type_is_a_fault(tmp_path: Path) -> None:
    text = ONE_VARIANT.replace('block: ["cta_threads", 1, 1]', 'block: ["element + 1", 1, 1]')
    msg = refused(tmp_path, text)
    assert f"bad.yaml:{line_of(text, 'block:')}: launch.block[0]: does not evaluate" in msg
    assert "can only concatenate str" in msg and "(with element='bf16')" in msg


def test_a_value_dependent_failure_is_left_to_the_planner(tmp_path: Path) -> None:
    """cta_threads - 128 is a zero divisor for one value only: the variant's verdict, not a fault."""
    text = ONE_VARIANT.replace('"hidden % (cta_threads * 8) == 0"', '"hidden // (cta_threads - 128) > 0"')
    assert load_spec(write_spec(tmp_path, "ok.yaml", text)).constraints


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("'a' * (1 << 30) != ''", "* would make a string or tuple of 1,073,741,824 items; at most 4096"),
        ("(1,) * (1 << 26) != ()", "* would make a string or tuple of 67,108,864 items"),
        ("'%0999999999d' % 1 != ''", "% formats a string here"),
        (
            "(1 << 256) * (1 << 256) * (1 << 256) * (1 << 256) * 2 > 0",
            "* makes a 1025-bit integer; at most 1024 bits",
        ),
    ],
)
def test_a_constraint_past_the_value_bounds_is_a_fault(tmp_path: Path, expression: str, reason: str) -> None:
    text = ONE_VARIANT.replace('"hidden % (cta_threads * 8) == 0"', f'"{expression}"')
    msg = refused(tmp_path, text)
    assert f"bad.yaml:{line_of(text, 'constraints:')}: constraints[0]: does not evaluate: " in msg
    assert reason in msg


def test_a_long_chain_is_refused_without_parsing_it(tmp_path: Path) -> None:
    text = ONE_VARIANT.replace('"hidden % (cta_threads * 8) == 0"', '"' + "+".join(["1"] * 100_000) + ' > 0"')
    msg = refused(tmp_path, text)
    assert "constraints[0]: bad expression '1+1+1" in msg and "is 200,003 characters long" in msg
    assert len(msg) < 1000  # the expression is shown elided


def test_a_deep_chain_within_the_length_bound_is_refused(tmp_path: Path) -> None:
    text = ONE_VARIANT.replace('"hidden % (cta_threads * 8) == 0"', '"' + "+".join(["1"] * 5000) + ' > 0"')
    assert "nests deeper than 100 levels" in refused(tmp_path, text)


@pytest.mark.parametrize(
    ("op", "reason"), [("*", "* makes a 1793-bit integer"), ("-", "at most 16,384 are read")]
)
def test_lets_that_double_are_refused(tmp_path: Path, op: str, reason: str) -> None:
    """Each let reads the one before twice: the value squares (``*``) or, substituted, the
    text doubles (``-``, whose value stays 0) at every step."""
    lets = "".join(f'    d{i}: "d{i - 1} {op} d{i - 1}"\n' for i in range(1, 41))
    text = ONE_VARIANT.replace("  smem: 0\n", '  smem: 0\n  let:\n    d0: "cta_threads"\n' + lets)
    text = text.replace('block: ["cta_threads", 1, 1]', 'block: ["d40", 1, 1]')
    msg = refused(tmp_path, text)
    assert f"bad.yaml:{line_of(text, 'let:' if op == '-' else 'd8:')}: launch.let" in msg and reason in msg


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('block: ["cta_threads", 1, 1]', 'block: ["element + 1", 1, 1]'),
        ("family: moe.topk_sum", 'family: !!python/name:os.system ""'),
        ('"hidden % (cta_threads * 8) == 0"', '"' + "+".join(["1"] * 100_000) + ' > 0"'),
        ('"hidden % (cta_threads * 8) == 0"', "\"'a' * (1 << 30) != ''\""),
    ],
)
def test_the_cli_exits_2_without_a_traceback(tmp_path: Path, old: str, new: str) -> None:
    path = write_spec(tmp_path, "bad.yaml", ONE_VARIANT.replace(old, new))
    result = CliRunner().invoke(cli.main, [str(path), "--registry", str(tmp_path / "r.db"), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert f"{path}:" in result.output and "Traceback" not in result.output
