"""Each spec's kernel entry held to the spec once, before anything compiles.

Importing a kernel module imports the CuTe DSL, which planning never does, so the entries of
the specs a build will compile are checked in one child process (``python -m
b12x_aot.compiler._probe SPEC...``, printing one JSON object): each is imported, and its kind,
arity, argument kinds, constructor keywords and Constexpr keywords compared with the spec
(``_entry.check_entry``). A fault stops the build with exit 2, once for the spec, instead of
failing every variant the same way.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._spec import Spec, load_spec
from .errors import EntryError, SpecError, SpecFault, ToolchainError

__all__ = ["check_entries"]

_MARK = "b12x-probe:"


def _kernel_line(path: Path) -> int:
    """The line of the spec's ``kernel:`` key, for the fault's location."""
    try:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("kernel:"):
                return number
    except OSError:
        pass
    return 0


def check_entries(specs: Sequence[Spec]) -> None:
    """Check every spec's entry in a child process; raise :class:`SpecError` for the first spec
    whose entry disagrees with it (every fault of that spec listed)."""
    if not specs:
        return
    command = [sys.executable, "-m", "b12x_aot.compiler._probe", *(str(s.path.resolve()) for s in specs)]
    # the DSL makes a cache directory under TMPDIR at import: one of ours, removed after
    with tempfile.TemporaryDirectory(prefix="b12x-probe-") as scratch:
        env = {
            **os.environ,
            "CUTE_DSL_ARCH": specs[0].archs[0],
            "TMPDIR": scratch,
            "CUTE_DSL_DUMP_DIR": scratch,
        }
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = next((ln[len(_MARK) :] for ln in proc.stdout.splitlines() if ln.startswith(_MARK)), None)
    if found is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise ToolchainError(
            "could not check the kernel entries (the CuTe DSL must import here: pip install -e .): "
            + " | ".join(tail)
        )
    for spec in specs:
        faults = json.loads(found).get(str(spec.path.resolve()), [])
        if faults:
            line = _kernel_line(spec.path)
            raise SpecError(spec.path, [SpecFault(line, "kernel", f) for f in faults])


def main(paths: Sequence[str]) -> None:
    from ._entry import check_entry, load_entry

    out: dict[str, list[str]] = {}
    for path in paths:
        spec = load_spec(path)
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                out[path] = check_entry(spec, load_entry(spec.kernel))
        except EntryError as exc:
            out[path] = [exc.format_message()]
        except Exception as exc:  # importing the user's module ran its code: say what it raised
            out[path] = [f"importing {spec.module} raised {type(exc).__name__}: {exc}"]
    print(_MARK + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
