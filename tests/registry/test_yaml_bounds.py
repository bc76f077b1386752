"""YAML inputs are read with bounded work: an alias bomb, a deep nesting or a huge file is
refused before it is expanded, and a manifest's refusals are exit 2 with the file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from b12x_aot.registry import BoundedLoader, YamlLimitError, read_yaml, yaml_fault
from b12x_aot.registry import _yaml as bounds

from .conftest import FakeRegistry, record, variant


def alias_bomb(levels: int, width: int = 9, indent: str = "") -> str:
    """``levels`` lists of ``width`` aliases of the one before: ``width ** levels`` values."""
    rows = [f'{indent}l0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        rows.append(f"{indent}l{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(rows) + "\n"


class CountingLoader(BoundedLoader):
    composed = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        CountingLoader.composed += 1
        return super().compose_node(parent, index)


def test_an_alias_bomb_is_refused_while_composing() -> None:
    """Twelve levels of nine aliases (2.8e11 values) are refused after composing each node of
    the text once: the work is the text's, never the expansion's."""
    CountingLoader.composed = 0
    with pytest.raises(YamlLimitError) as err:
        yaml.load(alias_bomb(12), Loader=CountingLoader)
    assert CountingLoader.composed < 12 * 12  # each alias is one node, its anchor's node reused
    line, reason = yaml_fault(err.value)
    assert line == 6  # l5, the first level past MAX_NODES: 1 + 9 * (1 + 9 * ...) = 125,479
    assert "expands to 125,479 values" in reason and "use fewer aliases" in reason


def test_aliases_within_the_bound_load_as_before() -> None:
    data = yaml.load(alias_bomb(3) + "x: *a3\n", Loader=BoundedLoader)
    assert len(data["x"]) == 9 and data["x"][0][0][0] == ["lol"]
    base = "base: &b {kind: ptr, align: 16}\nargs:\n  - {<<: *b, name: out}\n"
    assert yaml.load(base, Loader=BoundedLoader)["args"] == [{"kind": "ptr", "align": 16, "name": "out"}]


def test_deep_nesting_is_refused_with_its_line() -> None:
    text = "a:\n  " + "[" * (bounds.MAX_DEPTH + 10) + "]" * (bounds.MAX_DEPTH + 10) + "\n"
    with pytest.raises(YamlLimitError) as err:
        yaml.load(text, Loader=BoundedLoader)
    assert err.value.line == 2 and f"deeper than {bounds.MAX_DEPTH}" in err.value.problem


def test_a_file_past_the_size_bound_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bounds, "MAX_BYTES", 64)
    path = tmp_path / "big.yaml"
    path.write_text("x: 1\n" * 100)
    with pytest.raises(YamlLimitError) as err:
        read_yaml(path)
    assert err.value.line == 0 and "larger than" in err.value.problem
    path.write_text("x: 1\n")
    assert read_yaml(path) == b"x: 1\n"


def test_a_python_tag_names_its_line_and_the_fix() -> None:
    with pytest.raises(yaml.YAMLError) as err:
        yaml.load('a: 1\nfamily: !!python/name:os.system ""\n', Loader=BoundedLoader)
    line, reason = yaml_fault(err.value)
    assert line == 2 and "python/name:os.system" in reason and "remove the tag" in reason


# --- manifests through the CLI ------------------------------------------------------------


def manifest(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


def test_a_manifest_alias_bomb_exits_2_naming_file_and_line(
    tmp_path: Path, fake_registry: FakeRegistry, run_cli
) -> None:
    bomb = (
        "defs:\n"
        + alias_bomb(9, indent="  ")
        + "variants:\n  - {family: moe.fake, abi: 1, params: {hidden: *a9}}\n"
    )
    path = manifest(tmp_path, bomb)
    result = run_cli("export", "-r", fake_registry.path, "--manifest", path, tmp_path / "out.db")
    assert result.exit_code == 2
    assert f"manifest {path}:7: this value expands to" in result.stderr
    assert len(result.stderr) < 500 and "Traceback" not in result.stderr


def test_a_manifest_error_shows_a_bounded_value(tmp_path: Path, fake_registry: FakeRegistry, run_cli) -> None:
    """A bad value within the alias bound is shown elided, not whole."""
    text = (
        "defs:\n"
        + alias_bomb(4, indent="  ")
        + "variants:\n  - {family: moe.fake, abi: 1, params: {hidden: *a4}}\n"
    )
    path = manifest(tmp_path, text)
    result = run_cli("export", "-r", fake_registry.path, "--manifest", path, tmp_path / "out.db")
    assert result.exit_code == 2
    assert "variants[0].params.hidden: values must be ints, strings or bools (got [[[[...]" in result.stderr
    assert len(result.stderr) < 500


def test_a_manifest_tag_exits_2(tmp_path: Path, fake_registry: FakeRegistry, run_cli) -> None:
    path = manifest(tmp_path, 'variants:\n  - family: !!python/name:os.system ""\n    abi: 1\n')
    result = run_cli("export", "-r", fake_registry.path, "--manifest", path, tmp_path / "out.db")
    assert result.exit_code == 2
    assert f"manifest {path}:2: could not determine a constructor" in result.stderr


def test_an_unknown_manifest_param_is_named_with_the_family_params(
    tmp_path: Path, fake_registry: FakeRegistry, run_cli
) -> None:
    fake_registry.build([record(variant(2048))])
    path = manifest(tmp_path, "variants:\n  - {family: moe.fake, abi: 1, params: {hiden: 2048}}\n")
    result = run_cli("export", "-r", fake_registry.path, "--manifest", path, tmp_path / "out.db")
    assert result.exit_code != 0
    assert "moe.fake abi=1 has no param 'hiden' (its params: dtype, hidden)" in result.stderr
