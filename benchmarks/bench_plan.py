"""Planning cost of large param matrices: seconds and peak RSS of ``expand`` on each shape,
each in a fresh interpreter (no GPU, no DSL import).

    python benchmarks/bench_plan.py            # 10^7 with one constraint over every param, ...
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

CASES = {
    "10^7, one constraint reading all 7 params": (7, 10, ["p0 + p1 + p2 + p3 + p4 + p5 + p6 == 63"]),
    "10^7, constraints decided param by param": (
        7,
        10,
        ["p0 == 1", "p1 == 2", "p2 + p3 + p4 + p5 + p6 == 0"],
    ),
    "10^5, unconstrained (10^5 variants kept)": (5, 10, []),
    "10^6, unconstrained (10^6 variants kept)": (6, 10, []),
}

_RUN = """
import resource, sys, time
from b12x_aot.compiler._spec import load_spec
from b12x_aot.compiler._variants import expand
spec = load_spec(sys.argv[1])
start = time.perf_counter()
out = expand(spec)
took = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{took:.2f} s, {rss:.0f} MB peak RSS, {len(out.accepted)} kept, {out.tested:,} constraint evaluations")
"""


def _spec(params: int, values: int, constraints: list[str]) -> str:
    rows = "".join(f"  p{i}: [{', '.join(map(str, range(values)))}]\n" for i in range(params))
    listed = ", ".join(f'"{c}"' for c in constraints)
    return (
        "family: bench.plan\nabi: 1\nkernel: b12x_aot.kernels.topk_sum:TopKSum\narchs: [sm_90a]\n"
        f"params:\n{rows}constraints: [{listed}]\n"
        "args:\n  - {name: out, kind: ptr, dtype: fp32, align: 4, intent: out, shape: [n]}\n"
        "  - {name: n, kind: i32}\n"
        'launch: {grid: ["n", 1, 1], block: [128, 1, 1], smem: 0}\n'
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in CASES.items():
            path = Path(tmp) / "plan.yaml"
            path.write_text(_spec(*shape))
            out = subprocess.run(
                [sys.executable, "-c", _RUN, str(path)], capture_output=True, text=True, check=True
            )
            print(f"{name}: {out.stdout.strip()}")


if __name__ == "__main__":
    main()
