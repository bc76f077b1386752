"""Source-closure hashes follow a kernel's imports, re-exports included (no DSL needed)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from b12x_aot.compiler import source_closure


@pytest.fixture
def kernel_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """kpkg: a kernel module importing a re-exported submodule and a re-exported function."""
    root = tmp_path / "kpkg"
    (root / "utils").mkdir(parents=True)
    (root / "__init__.py").write_text("from .utils import swizzle\nfrom .defs import helper\n")
    (root / "utils" / "__init__.py").write_text("")
    (root / "utils" / "swizzle.py").write_text("MODE = 1\n")
    (root / "defs.py").write_text("def helper():\n    return 2\n")
    (root / "kern.py").write_text("from kpkg import helper, swizzle\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return root


def test_a_reexported_submodule_is_in_the_closure_and_its_edits_change_the_hash(kernel_package: Path) -> None:
    before = source_closure("kpkg.kern")
    modules = dict(before.files)
    assert {"kpkg.kern", "kpkg.defs", "kpkg.utils", "kpkg.utils.swizzle"} <= modules.keys()
    assert "kpkg" not in modules  # both names are re-exports: the __init__ itself is left out
    (kernel_package / "utils" / "swizzle.py").write_text("MODE = 2\n")
    assert source_closure("kpkg.kern").hash != before.hash
