"""Build throughput: a no-op rebuild of many present variants, and compiles with -j 1 vs -j 2.

1. No-op rebuild: ``b12x-compile`` over a spec whose every variant is already present
   (benchmarks/specs/bench_topk_sum_1000.yaml: 1,000 variants), wall time of the whole command.
2. Compile throughput: the bundled small-kernel specs (moe.topk_sum and quant.mxfp8, narrowed
   with --where to keep the run short) into fresh registries with -j 1 and then -j 2, in one
   run, as variants per second and the scaling between the two.

    python benchmarks/bench_compile.py --json out.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import emit, timed_compile

ROOT = Path(__file__).resolve().parents[1]
NOOP_SPEC = ROOT / "benchmarks" / "specs" / "bench_topk_sum_1000.yaml"
THROUGHPUT = [
    (ROOT / "specs" / "moe_topk_sum.yaml", ["--where", "topk=8"]),
    (ROOT / "specs" / "quant_mxfp8.yaml", ["--where", "K=7168"]),
]


def noop(registry: Path, runs: int) -> dict:
    if not registry.exists():
        print(f"building {registry} from {NOOP_SPEC.name} first (a one-off)", file=sys.stderr)
        timed_compile([str(NOOP_SPEC), "--registry", str(registry)])
    times = []
    for _ in range(runs):
        elapsed, summary = timed_compile([str(NOOP_SPEC), "--registry", str(registry)])
        assert summary["built"] == 0 and summary["planned"]["present"] == 1000, summary["planned"]
        times.append(elapsed)
    return {"variants": 1000, "seconds": statistics.median(times), "samples": times}


def throughput(arch: str, jobs: list[int]) -> dict:
    result: dict[str, dict] = {}
    for j in jobs:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "r.db"
            total = 0
            elapsed = 0.0
            for spec, narrow in THROUGHPUT:
                seconds, summary = timed_compile(
                    [str(spec), "--registry", str(db), "--arch", arch, "-j", str(j), *narrow]
                )
                total += summary["built"]
                elapsed += seconds
            result[f"j{j}"] = {"variants": total, "seconds": elapsed, "per_second": total / elapsed}
    base = result[f"j{jobs[0]}"]["per_second"]
    for entry in result.values():
        entry["speedup"] = entry["per_second"] / base
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noop-registry", default=str(ROOT / "build" / "startup" / "startup1000.db"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    result = {
        "noop": noop(Path(opts.noop_registry), opts.runs),
        "throughput": throughput(opts.arch, opts.jobs),
    }
    print(
        f"no-op rebuild of 1000 present variants: {result['noop']['seconds']:.2f} s (median of {opts.runs})"
    )
    for name, t in result["throughput"].items():
        print(
            f"{name}: {t['variants']} variants in {t['seconds']:.1f} s = {t['per_second']:.2f}/s "
            f"({t['speedup']:.2f}x of -j {opts.jobs[0]})"
        )
    emit(result, opts.json)


if __name__ == "__main__":
    main()
