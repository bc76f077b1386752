"""Build failure modes: per-variant timeouts, register bounds, no nvdisasm, no DSL at plan time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ONE_ARCH, ONE_VARIANT, ROOT, registry_cli, run_compile, run_compile_after, write_spec

pytestmark = pytest.mark.dsl


def test_a_variant_past_its_timeout_fails_alone(tmp_path: Path) -> None:
    # A kernel package whose construction stalls for one param value: that variant times out,
    # its worker is replaced, and the others land.
    pkg = tmp_path / "pkgs" / "slowkernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "topk_sum.py").write_text(
        "import time\n"
        "from b12x_aot.kernels.topk_sum import TopKSum as _Base\n\n\n"
        "class TopKSum(_Base):\n"
        "    def __init__(self, geometry, static, **params):\n"
        "        if params['output'] == 'bf16':\n"
        "            time.sleep(300)\n"
        "        super().__init__(geometry, static, **params)\n"
    )
    spec = write_spec(
        tmp_path,
        "slow.yaml",
        ONE_ARCH.replace("b12x_aot.kernels.topk_sum:TopKSum", "slowkernels.topk_sum:TopKSum"),
    )
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkgs"), "TMPDIR": str(temp)}
    db = str(tmp_path / "r.db")
    proc = run_compile(
        str(spec), "--registry", db, "-j", "2", "--timeout", "20", "--json", env=env, timeout=600, check=False
    )
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["built"] == 2
    assert len(summary["failed"]) == 2
    for failure in summary["failed"]:
        assert "output=bf16" in failure["variant"]
        assert failure["stage"] == "worker" and "exceeded the 20 s timeout" in failure["reason"]
    # Workers' scratch (DSL dumps, nvdisasm inputs) is gone, also that of the killed workers.
    assert list(temp.iterdir()) == []
    # A timeout is not a verdict on the inputs: the next plan retries it.
    again = run_compile(str(spec), "--registry", db, "--dry-run", "--json", env=env)
    counts = json.loads(again.stdout)["counts"]
    assert counts["present"] == 2 and counts["new"] == 2 and counts["failed"] == 0


def test_register_bound_rejects_with_figures(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        "bounded.yaml",
        ONE_ARCH.replace("max_spill_bytes: 0", "max_spill_bytes: 0\n  max_registers: 16"),
    )
    db = tmp_path / "r.db"
    proc = run_compile(str(spec), "--registry", str(db), "-j", "2", "--json", check=False)
    assert proc.returncode == 0  # a rejection is a verdict, not a failure
    summary = json.loads(proc.stdout)
    assert summary["built"] == 0 and len(summary["rejected"]) == 4
    for rejected in summary["rejected"]:
        assert rejected["stage"] == "limits"
        assert rejected["reason"].startswith("registers ") and "> max_registers 16" in rejected["reason"]
    plan = json.loads(run_compile(str(spec), "--registry", str(db), "--dry-run", "--json").stdout)
    assert plan["counts"]["rejected"] == 4 and plan["counts"]["new"] == 0  # not recompiled
    # The audit CLI lists the rejections, as JSON and as a table, and prints one's full log.
    cli = ("failures", "-r", str(db))
    listed = json.loads(registry_cli(*cli, "--json").stdout)
    assert sorted(f["stage"] for f in listed) == ["limits"] * 4
    assert {f["key"] for f in listed} == {r["key"] for r in summary["rejected"]}
    table = registry_cli(*cli)  # piped: one line per failure on stdout, the count on stderr
    rows = table.stdout.splitlines()
    assert len(rows) == 4 and all("\tmoe.topk_sum[" in row and "\tlimits\t" in row for row in rows)
    assert "4 failure(s)" in table.stderr
    assert "max_registers 16" in registry_cli(*cli, "--log", listed[0]["key"][:12]).stdout


def test_planning_never_imports_the_dsl(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "s.yaml", ONE_ARCH)
    code = (
        "import sys\n"
        "from b12x_aot.compiler.cli import main\n"
        f"try:\n    main([{str(spec)!r}, '--registry', {str(tmp_path / 'r.db')!r}, '--dry-run', '--json'])\n"
        "except SystemExit:\n    pass\n"
        "print('DSL', 'cutlass' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip().splitlines()[-1] == "DSL False"


def test_missing_nvdisasm_degrades_to_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from b12x_aot.compiler import _sass

    monkeypatch.setattr(_sass.shutil, "which", lambda name: None)
    monkeypatch.setattr(_sass, "_nvidia_roots", lambda: [])
    _sass.find_nvdisasm.cache_clear()
    try:
        assert _sass.find_nvdisasm() is None
        assert _sass.sass_histograms(b"\x7fELF not really") is None
    finally:
        _sass.find_nvdisasm.cache_clear()


def test_build_warns_when_nvdisasm_is_missing(tmp_path: Path) -> None:
    # No limit needs SASS here (with one, the build is refused: test_build_cli.py).
    spec = write_spec(tmp_path, "s.yaml", ONE_VARIANT.replace("limits:\n  max_spill_bytes: 0\n", ""))
    prelude = "from b12x_aot.compiler import _sass\n_sass.find_nvdisasm = lambda: None\n"
    proc = run_compile_after(prelude, str(spec), "--registry", str(tmp_path / "r.db"), "-j", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert (
        "warning: nvdisasm not found on this machine (install nvidia-cuda-nvdisasm, the [sass] extra)"
        in proc.stderr
    )


@pytest.mark.parametrize(
    ("executor", "message"),
    [
        (
            "ftp://sched:8786",
            "--executor takes local, dask://HOST:PORT (or tcp://, tls://) or dask+file://PATH",
        ),
        ("dask://sched", "needs a scheduler address HOST:PORT, like dask://sched:8786 (got 'dask://sched')"),
        ("dask+file://", "--executor dask+file:// needs a path"),
    ],
)
def test_a_bad_executor_is_refused_before_planning(tmp_path: Path, executor: str, message: str) -> None:
    spec = write_spec(tmp_path, "s.yaml", ONE_ARCH)
    proc = run_compile(
        str(spec), "--registry", str(tmp_path / "r.db"), "--executor", executor, "--dry-run", check=False
    )
    assert proc.returncode == 2
    assert message in " ".join(proc.stderr.split())


def test_a_cluster_build_without_the_dask_extra_says_how_to_get_it(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "s.yaml", ONE_ARCH)
    no_dask = "sys.modules['distributed'] = None  # as if the [dask] extra were not installed\n"
    proc = run_compile_after(
        no_dask, str(spec), "--registry", str(tmp_path / "r.db"), "--executor", "dask://sched:8786"
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'b12x-aot[dask]'" in proc.stderr
