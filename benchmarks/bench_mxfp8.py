#!/usr/bin/env python3
"""quant.mxfp8 on one GPU: bandwidth against a device-to-device copy, and small-M latency.

Everything is measured in one process, as ratios:

- **bandwidth**: every variant of the device's arch at ``M = cdiv(--elements, K)`` rows (64 Mi
  elements by default), counting ``2*M*K`` bytes read and ``M*K + M*K/32`` written, against a
  torch ``copy_`` of a 256 MiB buffer (bytes read + written) timed the same way;
- **latency**: ``M = 1..16`` rows next to a torch implementation of the same quantization.

Each timing is a CUDA graph of ``--graph-launches`` back-to-back launches that rotate among
``--buffers`` input/output sets (so L2 cannot hold them), replayed ``--reps`` times after
``--warmup`` replays; the per-launch time is the median replay time over the launch count.
The torch implementation is also checked bit for bit against the kernel before it is timed.

    python benchmarks/bench_mxfp8.py --registry build/kernels.db --json mxfp8.json

Imports only torch and the loader (no CuTe DSL): run it on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

import torch

from b12x_aot.loader import Registry

FAMILY = "quant.mxfp8"
BLOCK = 32
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SMALL_M = (1, 2, 4, 8, 16)


def torch_mxfp8(x: torch.Tensor, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The same quantization in plain torch ops (what one would write without a kernel)."""
    m, k = x.shape
    xf = x.float().view(m, k // BLOCK, BLOCK)
    amax = torch.where(torch.isfinite(xf), xf.abs(), 0.0).amax(dim=-1)
    bits = amax.view(torch.int32)
    biased = bits >> 23
    if rounding == "ceil":
        biased = biased + ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    byte = (biased - 8).clamp_min(0)
    inv = ((254 - byte) << 23).view(torch.float32)
    y = (xf * inv[..., None]).clamp(-448.0, 448.0).view(m, k)
    q = y.to(torch.float8_e4m3fn).view(torch.uint8)
    nan_byte = torch.where(x.view(torch.int16) < 0, 0xFF, 0x7F).to(torch.uint8)  # the NaN's own sign
    q = torch.where(torch.isnan(x), nan_byte, q)
    return q.view(torch.float8_e4m3fn), byte.to(torch.uint8)


def graph_time_us(launch: Callable[[int], None], nbuf: int, launches: int, warmup: int, reps: int) -> float:
    """Median per-launch device time of a graph of ``launches`` calls ``launch(i % nbuf)``."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(nbuf):  # warm up on the capture stream (loads, allocator)
            launch(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(launches):
            launch(i % nbuf)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def quant_bytes(m: int, k: int) -> int:
    return 2 * m * k + m * k + m * k // BLOCK


def buffers(m: int, k: int, dtype: torch.dtype, nbuf: int, gen: torch.Generator) -> list[tuple]:
    sets = []
    for _ in range(nbuf):
        x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        q = torch.empty(m, k, device="cuda", dtype=torch.float8_e4m3fn)
        s = torch.empty(m, k // BLOCK, device="cuda", dtype=torch.uint8)
        sets.append((q, s, x))
    return sets


def check_torch_matches(prepared, params: dict, gen: torch.Generator) -> None:
    x = torch.randn(64, params["K"], device="cuda", generator=gen).to(DTYPES[params["dtype"]])
    x[0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e-30])
    x.view(torch.int16)[1, :2] = torch.tensor([0x7FFF, -1], dtype=torch.int16)  # +NaN, -NaN in both dtypes
    q = torch.full((64, params["K"]), 0xFF, device="cuda", dtype=torch.uint8).view(torch.float8_e4m3fn)
    s = torch.full((64, params["K"] // BLOCK), 0xFF, device="cuda", dtype=torch.uint8)
    prepared.checked(q, s, x, 64)
    tq, ts = torch_mxfp8(x, params["rounding"])
    torch.cuda.synchronize()
    if not (torch.equal(q.view(torch.uint8), tq.view(torch.uint8)) and torch.equal(s, ts)):
        raise SystemExit(f"kernel and torch implementation disagree for {params}")


def copy_bandwidth(args, gen: torch.Generator) -> dict:
    n = 256 << 20
    pairs = [
        (torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda"))
        for _ in range(args.buffers)
    ]
    for src, _ in pairs:
        src.random_(0, 256, generator=gen)
    us = graph_time_us(
        lambda i: pairs[i][1].copy_(pairs[i][0]), args.buffers, args.graph_launches, args.warmup, args.reps
    )
    return {"bytes": 2 * n, "us": us, "GBps": 2 * n / us / 1e3}


def bandwidth(registry: Registry, entries: list, args, copy_gbps: float, gen: torch.Generator) -> list:
    by_shape: dict[tuple[str, int], list] = {}
    for e in entries:
        by_shape.setdefault((e.params["dtype"], e.params["K"]), []).append(e)
    rows = []
    for (dtype, k), group in sorted(by_shape.items()):
        rows += _bandwidth_of_shape(registry, group, dtype, k, args, copy_gbps, gen)
        torch.cuda.empty_cache()  # this shape's buffers are gone; keep the pool small
    return rows


def _bandwidth_of_shape(registry, group, dtype: str, k: int, args, copy_gbps: float, gen) -> list:
    m = -(-args.elements // k)
    sets = buffers(m, k, DTYPES[dtype], args.buffers, gen)
    rows = []
    for e in sorted(group, key=lambda e: (e.params["rounding"], e.params["cta_threads"])):
        prepared = registry.kernel(FAMILY, e.abi, **e.params).prepare()
        check_torch_matches(prepared, e.params, gen)
        us = graph_time_us(
            lambda i, p=prepared: p(*sets[i], m), args.buffers, args.graph_launches, args.warmup, args.reps
        )
        gbps = quant_bytes(m, k) / us / 1e3
        rows.append({**e.params, "M": m, "us": us, "GBps": gbps, "of_copy": gbps / copy_gbps})
    return rows


def latency(registry: Registry, entries: list, args, gen: torch.Generator) -> list:
    rows = []
    for e in entries:
        p = e.params
        if p["rounding"] != "floor" or p["cta_threads"] != args.latency_threads:
            continue
        prepared = registry.kernel(FAMILY, e.abi, **p).prepare()
        for m in SMALL_M:
            sets = buffers(m, p["K"], DTYPES[p["dtype"]], args.buffers, gen)
            timing = (args.buffers, args.graph_launches, args.warmup, args.reps)
            kernel_us = graph_time_us(lambda i, s=sets, m=m, p=prepared: p(*s[i], m), *timing)
            torch_us = graph_time_us(lambda i, s=sets, r=p["rounding"]: torch_mxfp8(s[i][2], r), *timing)
            rows.append(
                {**p, "M": m, "kernel_us": kernel_us, "torch_us": torch_us, "speedup": torch_us / kernel_us}
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", required=True, help="a registry with quant.mxfp8 built for this GPU")
    parser.add_argument("--json", metavar="OUT", help="write every measurement here")
    parser.add_argument("--elements", type=int, default=64 << 20, help="M*K for bandwidth (default 64 Mi)")
    parser.add_argument("--buffers", type=int, default=3, help="input/output sets to rotate among")
    parser.add_argument("--graph-launches", type=int, default=20, help="launches per graph replay")
    parser.add_argument("--warmup", type=int, default=5, help="graph replays before timing")
    parser.add_argument("--reps", type=int, default=30, help="timed graph replays (median)")
    parser.add_argument("--latency-threads", type=int, default=128, help="cta_threads for the latency table")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    registry = Registry.open(args.registry)
    arch = registry.arch(torch.cuda.current_device())
    entries = sorted(
        (e for e in registry.entries() if e.family == FAMILY and e.arch == arch),
        key=lambda e: sorted(e.params.items()),
    )
    if not entries:
        print(f"the registry has no {FAMILY} variants for {arch}", file=sys.stderr)
        return 2

    copy = copy_bandwidth(args, gen)
    print(f"{torch.cuda.get_device_name()} ({arch}); torch copy_: {copy['GBps']:.0f} GB/s (read + write)")
    bw = bandwidth(registry, entries, args, copy["GBps"], gen)
    print(f"\nbandwidth at M*K >= {args.elements / 2**20:.0f} Mi elements (2MK read + MK + MK/32 written)")
    print(f"{'dtype':5} {'K':>6} {'rounding':8} {'cta':>4} {'M':>6} {'us':>8} {'GB/s':>7} {'of copy':>8}")
    for r in bw:
        print(
            f"{r['dtype']:5} {r['K']:>6} {r['rounding']:8} {r['cta_threads']:>4} {r['M']:>6} "
            f"{r['us']:>8.1f} {r['GBps']:>7.0f} {r['of_copy']:>8.3f}"
        )
    lat = [] if args.skip_latency else latency(registry, entries, args, gen)
    if lat:
        print(f"\nsmall-M latency per launch (graph-replayed), cta_threads={args.latency_threads}, floor")
        print(f"{'dtype':5} {'K':>6} {'M':>3} {'kernel us':>10} {'torch us':>9} {'torch/kernel':>12}")
        for r in lat:
            print(
                f"{r['dtype']:5} {r['K']:>6} {r['M']:>3} {r['kernel_us']:>10.2f} {r['torch_us']:>9.2f} "
                f"{r['speedup']:>12.1f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "arch": arch,
                    "copy": copy,
                    "bandwidth": bw,
                    "latency": lat,
                },
                f,
                indent=1,
            )
    registry.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
