"""Executor overhead: the bundled specs for one arch on the local pool and on a dask cluster.

``b12x-compile specs/ --arch ARCH`` into a fresh registry with ``--executor local -j N``, then
into another with ``--executor tcp://...`` against an N-worker dask LocalCluster (N processes
of one thread, started before the timer) on the same machine, back to back in one run. Both get
the same N cores, so the ratio of their variants per second is the cluster's overhead (its
toolchain check, scheduling, and results sent over TCP), not a speed-up. Needs the [dask] extra.

    python benchmarks/bench_executors.py --json out.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import emit, timed_compile

ROOT = Path(__file__).resolve().parents[1]


def build(registry: Path, arch: str, executor: list[str], narrow: list[str]) -> dict:
    args = [str(ROOT / "specs"), "--registry", str(registry), "--arch", arch, *executor, *narrow]
    seconds, summary = timed_compile(args)
    return {"command": " ".join(["b12x-compile", *args]), "variants": summary["built"], "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--workers", type=int, default=2, help="-j of the pool, workers of the cluster")
    parser.add_argument("--where", action="append", default=[], metavar="PARAM=VALUE")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    from distributed import LocalCluster

    narrow = [arg for item in opts.where for arg in ("--where", item)]
    result: dict[str, dict] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(
            n_workers=opts.workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
    ):
        result["local"] = build(Path(tmp) / "local.db", opts.arch, ["-j", str(opts.workers)], narrow)
        result["dask"] = build(
            Path(tmp) / "dask.db", opts.arch, ["--executor", cluster.scheduler_address], narrow
        )
    for entry in result.values():
        entry["per_second"] = entry["variants"] / entry["seconds"]
    ratio = result["dask"]["per_second"] / result["local"]["per_second"]
    for name, entry in result.items():
        print(
            f"{name:5}: {entry['variants']} variants in {entry['seconds']:.1f} s = "
            f"{entry['per_second']:.2f}/s   ({entry['command']})"
        )
    print(f"dask / local: {ratio:.3f}")
    emit({**result, "ratio": ratio, "workers": opts.workers, "arch": opts.arch}, opts.json)


if __name__ == "__main__":
    main()
