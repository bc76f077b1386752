"""Startup costs: importing the loader, and opening + preloading N variants.

1. Import time, each a fresh interpreter, median of many runs: bare Python; Python importing
   the loader's unavoidable dependencies (sqlite3 + cuda.bindings.driver); Python importing
   b12x_aot.loader.
2. Open + resolve + verify + preload of the first N variants of a registry against the bare
   driver loop over the same cubins (sha256 + cuLibraryLoadData + cuLibraryGetKernel +
   cuKernelGetFunction), both after cuInit, in the same process, alternating which goes first.

    python benchmarks/bench_startup.py --registry startup1000.db --counts 100 1000 --json out.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import emit


def _env(bytecode: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _import_ms(statement: str, runs: int, bytecode: bool = True) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    samples = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=_env(bytecode)
        )
        samples.append(float(out.stdout.strip()) * 1e3)
    return statistics.median(samples)


def _wall_ms(statement: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True, env=_env(True))
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _compile_loader() -> None:
    """Serving images ship bytecode: compile the loader once, as an image build would."""
    import importlib.util

    spec = importlib.util.find_spec("b12x_aot.loader")
    assert spec is not None and spec.submodule_search_locations
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *spec.submodule_search_locations],
        check=True,
        env=_env(True),
    )


def imports(runs: int) -> dict[str, float]:
    _compile_loader()
    return {
        "python_wall_ms": _wall_ms("pass", runs),
        "deps_wall_ms": _wall_ms("import sqlite3, cuda.bindings.driver", runs),
        "loader_wall_ms": _wall_ms("import b12x_aot.loader", runs),
        "deps_import_ms": _import_ms("import sqlite3, cuda.bindings.driver", runs),
        "loader_import_ms": _import_ms("import b12x_aot.loader", runs),
        "loader_after_deps_ms": _import_ms(
            "import sqlite3, cuda.bindings.driver; t = time.perf_counter(); import b12x_aot.loader", runs
        ),
        "loader_after_deps_no_bytecode_ms": _import_ms(
            "import sqlite3, cuda.bindings.driver; t = time.perf_counter(); import b12x_aot.loader",
            runs,
            bytecode=False,
        ),
    }


_CHILD = r"""
import hashlib, json, sqlite3, sys, time
from cuda.bindings import driver as cu
path, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cu.cuInit(0)
err, dev = cu.cuDeviceGet(0)
err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
cu.cuCtxSetCurrent(ctx)
if mode == "bare":
    db = sqlite3.connect(path)
    rows = db.execute(
        "SELECT k.symbol, a.sha256, a.data FROM current_variants c JOIN variants v ON v.id = c.variant_id "
        "JOIN kernels k ON k.variant_id = v.id JOIN artifacts a ON a.sha256 = v.artifact_sha256 "
        "ORDER BY c.key LIMIT ?", (count,)).fetchall()
    blobs = [(s.encode(), sha, bytes(d)) for s, sha, d in rows]
    start = time.perf_counter()
    for symbol, sha, data in blobs:
        assert hashlib.sha256(data).hexdigest() == sha
        err, lib = cu.cuLibraryLoadData(data, None, None, 0, None, None, 0)
        assert int(err) == 0, err
        err, kern = cu.cuLibraryGetKernel(lib, symbol)
        err, fn = cu.cuKernelGetFunction(kern)
        assert int(err) == 0, err
    elapsed = time.perf_counter() - start
else:
    from b12x_aot.loader import Registry
    # What a deployment knows up front: the exact variants it needs (as a manifest).
    db = sqlite3.connect(path)
    rows = db.execute(
        "SELECT v.family, v.abi, v.params_json FROM current_variants c JOIN variants v ON v.id = c.variant_id "
        "ORDER BY c.key LIMIT ?", (count,)).fetchall()
    db.close()
    manifest = {"variants": [{"family": f, "abi": a, "params": json.loads(p)} for f, a, p in rows]}
    start = time.perf_counter()
    reg = Registry.open(path)
    reg.preload(manifest, devices=[0])
    elapsed = time.perf_counter() - start
    assert reg.stats.loads == count and reg.stats.functions == count
print(json.dumps({"ms": elapsed * 1e3}))
"""


def preload(registry: str, count: int, repeats: int) -> dict[str, float]:
    """Each measurement in a fresh process, so no path benefits from the other's driver state."""
    import json

    times: dict[str, list[float]] = {"bare": [], "loader": []}
    for i in range(repeats):
        order = ("bare", "loader") if i % 2 == 0 else ("loader", "bare")
        for mode in order:
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, registry, str(count), mode],
                capture_output=True,
                text=True,
                check=True,
            )
            times[mode].append(json.loads(out.stdout.strip().splitlines()[-1])["ms"])
    bare, loader = statistics.median(times["bare"]), statistics.median(times["loader"])
    return {"bare_ms": bare, "loader_ms": loader, "ratio": loader / bare, "samples": times}  # type: ignore[dict-item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True, help="a registry with at least max(--counts) variants")
    parser.add_argument("--counts", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--import-runs", type=int, default=21)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    result: dict[str, object] = {"imports": imports(opts.import_runs)}
    im = result["imports"]
    assert isinstance(im, dict)
    print(
        f"import: python {im['python_wall_ms']:.1f} ms, +deps {im['deps_wall_ms'] - im['python_wall_ms']:.1f} ms, "
        f"+loader {im['loader_wall_ms'] - im['python_wall_ms']:.1f} ms over bare python "
        f"({im['loader_wall_ms'] - im['deps_wall_ms']:.1f} ms over its deps; in-process after deps: "
        f"{im['loader_after_deps_ms']:.1f} ms; without bytecode {im['loader_after_deps_no_bytecode_ms']:.1f} ms)"
    )
    for count in opts.counts:
        r = preload(opts.registry, count, opts.repeats)
        result[f"preload_{count}"] = r
        print(
            f"preload {count}: loader {r['loader_ms']:.1f} ms vs bare {r['bare_ms']:.1f} ms = {r['ratio']:.2f}x"
        )
    emit(result, opts.json)


if __name__ == "__main__":
    main()
