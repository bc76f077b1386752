"""Importing the loader must not pull in the build side or torch."""

from __future__ import annotations

import subprocess
import sys


def test_loader_import_is_thin() -> None:
    code = (
        "import sys, b12x_aot.loader;"
        "print(' '.join(sorted(m for m in ('sqlalchemy', 'cutlass', 'torch', 'yaml', 'pydantic', 'rich', 'click', "
        "'elftools', 'b12x_aot.compiler', 'b12x_aot.registry') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_loader_import_does_no_driver_work() -> None:
    code = "import b12x_aot.loader._cuda as c, b12x_aot.loader; print(c._initialized)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
