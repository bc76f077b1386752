"""Timing helpers shared by the benchmarks: host-side launch batches, CUDA-event device times."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "copy_gbps",
    "device_ms",
    "emit",
    "floor_path",
    "graph_us",
    "host_us_per_call",
    "ratio_table",
    "timed_compile",
]

SPIN_CYCLES = 100_000  # about 50 us at the H200's 1.98 GHz: longer than a Python launch


def host_us_per_call(
    fn: Callable[[], Any],
    sync: Callable[[], Any],
    *,
    batch: int = 128,
    batches: int = 60,
    warmup: int = 5,
    raw: bool = False,
) -> dict[str, Any]:
    """Host microseconds per call: time ``batch`` calls, synchronize outside the timer.

    Batches stay short enough (<= 256 launches) that the GPU queue never throttles the host.
    Returns the median and the quartiles over ``batches`` batches; with ``raw``, also every
    batch's us per call in order (``samples_us``).
    """
    samples: list[float] = []
    for i in range(warmup + batches):
        sync()
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        elapsed = time.perf_counter() - start
        sync()
        if i >= warmup:
            samples.append(elapsed / batch * 1e6)
    q = statistics.quantiles(samples, n=4)
    result: dict[str, Any] = {"median_us": statistics.median(samples), "p25_us": q[0], "p75_us": q[2]}
    if raw:
        result["samples_us"] = samples
    return result


def device_ms(
    fn: Callable[[], Any],
    *,
    reps: int = 50,
    warmup: int = 5,
    before: Callable[[], Any] | None = None,
    samples: list[float] | None = None,
) -> float:
    """Median device milliseconds of ``fn`` measured with CUDA events, one event pair per rep
    (each rep's ms appended to ``samples`` when given).

    ``before`` (say, an L2 flush) runs untimed ahead of every timed rep. Then the GPU spins for
    about 50 us, so the host submits the start event and ``fn``'s launches while it is busy: an
    idle GPU would run the start event at once and count the host's launch time as device time
    (5-15 us of Python per launch, a tenth of a 50 us kernel).
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        torch.cuda._sleep(SPIN_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    if samples is not None:
        samples.extend(times)
    return statistics.median(times)


def graph_us(fn: Callable[[], Any], launches: int = 50, reps: int = 20) -> float:
    """Per-launch device microseconds from replaying a CUDA graph of ``launches`` calls of ``fn``:
    back-to-back launches without host gaps, on a GPU kept at its working clocks."""
    import torch

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(launches):
            fn()
    return device_ms(graph.replay, reps=reps) * 1e3 / launches


def copy_gbps(nbytes: int) -> float:
    """A device-to-device copy of ``nbytes``: GB/s read + written."""
    import torch

    src = torch.empty(nbytes // 4, device="cuda", dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    ms = device_ms(lambda: dst.copy_(src), reps=30)
    return 2 * nbytes / ms / 1e6


def ratio_table(rows: Sequence[tuple[str, float]], *, unit: str, base: str) -> str:
    """A plain-text table of values and their ratio to the row named ``base``."""
    ref = dict(rows)[base]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'path':<{width}}  {unit:>10}  {'x ' + base:>14}"]
    for name, value in rows:
        lines.append(f"{name:<{width}}  {value:>10.2f}  {value / ref:>14.2f}")
    return "\n".join(lines)


def timed_compile(args: list[str]) -> tuple[float, dict]:
    """Run ``b12x-compile ARGS --json`` from the repository root: wall seconds and its summary.
    Exits with its stderr if it fails."""
    root = Path(__file__).resolve().parents[1]
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "b12x_aot.compiler", *args, "--json"], capture_output=True, text=True, cwd=root
    )
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"b12x-compile {' '.join(args)} failed:\n{out.stderr}")
    return elapsed, json.loads(out.stdout)


def emit(result: dict[str, Any], path: str | None) -> None:
    """Write JSON to ``path`` (and say where), or to stdout."""
    text = json.dumps(result, indent=1, default=str)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(text)


def floor_path(bare: Callable[[], None], tensors: Sequence[Any]) -> Callable[[], None]:
    """``bare`` after reading each tensor's pointer, shape and strides: the least any launch
    from torch tensors does on the host, against which a launcher's own cost shows."""
    a, b, c = tensors  # straight-line reads: a loop would add its own cost to the floor

    def floor() -> None:
        a.data_ptr(), a.shape, a.stride()
        b.data_ptr(), b.shape, b.stride()
        c.data_ptr(), c.shape, c.stride()
        bare()

    return floor
