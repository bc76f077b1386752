"""moe.topk_sum achieved bandwidth against a device-to-device copy measured in the same run.

Bytes counted: routed rows read (M * topk * hidden * element size, all routes valid),
weights and ids read, output written. Several input sets rotate so L2 never holds them. Two
ratios: against a large copy (the device's bandwidth), and against a copy of the same number of
bytes timed alike (the bound at this size: a 20 us kernel pays ramp and tail a 500 us copy does
not).
Small M is latency-bound: there the per-launch time inside a CUDA graph is reported too,
next to a torch implementation timed the same way.

    python benchmarks/bench_topk_sum.py --registry build/kernels.db --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from b12x_aot.loader import Registry, VariantMissError

from _timing import copy_gbps, device_ms, emit, graph_us

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NUM_EXPERTS = 256
PARAMS = ("element", "output", "topk", "hidden", "cta_threads", "tokens_per_cta")
CASES = tuple(
    (dict(zip(PARAMS, row[:-1], strict=True)), row[-1])
    for row in (
        ("bf16", "bf16", 8, 7168, 128, 1, 4096),
        ("bf16", "fp32", 8, 7168, 128, 1, 4096),
        ("bf16", "bf16", 8, 4096, 256, 1, 4096),
        ("fp16", "fp16", 4, 2048, 256, 1, 8192),
        ("bf16", "bf16", 8, 7168, 128, 1, 16),
        ("bf16", "bf16", 8, 7168, 128, 1, 1),
        ("bf16", "bf16", 2, 7168, 128, 1, 4096),
        # one route per token: one token per CTA, then four (the op's choice); at 8,192 tokens
        # the launch moves 67 MB, too few for a copy of them to reach the large copy's rate
        ("bf16", "bf16", 1, 2048, 256, 1, 8192),
        ("bf16", "bf16", 1, 2048, 256, 4, 8192),
        ("bf16", "bf16", 1, 2048, 256, 1, 32768),
        ("bf16", "bf16", 1, 2048, 256, 4, 32768),
        ("bf16", "bf16", 1, 7168, 128, 4, 16),
    )
)


def same_size_copy_ms(nbytes: int, sets: int) -> float:
    """A device copy moving ``nbytes`` (half read, half written), over ``sets`` rotating buffer
    pairs like the kernel's inputs: the bound at this size, where launch ramp and tail weigh
    more than in the large copy of the headline ratio."""
    pairs = []
    for _ in range(sets):
        src = torch.empty(max(nbytes // 8, 1), device="cuda", dtype=torch.float32).uniform_()
        pairs.append((src, torch.empty_like(src)))
    turns = itertools.cycle(pairs)

    def copy() -> None:
        src, dst = next(turns)
        dst.copy_(src)

    return device_ms(copy, reps=30)


def run(registry: Registry, params: dict, m: int, sets: int = 3) -> dict:
    launch = registry.kernel("moe.topk_sum", 1, **params).prepare()
    topk, hidden = params["topk"], params["hidden"]
    el, out_t = DTYPES[params["element"]], DTYPES[params["output"]]
    inputs = []
    for _ in range(sets):
        routed = torch.randn(m, topk, hidden, device="cuda").to(el)
        weights = torch.rand(m, topk, device="cuda")
        ids = torch.randint(0, NUM_EXPERTS, (m, topk), device="cuda", dtype=torch.int32)
        out = torch.empty(m, hidden, device="cuda", dtype=out_t)
        inputs.append((out, routed, weights, ids))
    turns = itertools.cycle(inputs)

    def step() -> None:
        out, routed, weights, ids = next(turns)
        launch(out, routed, weights, ids, m, NUM_EXPERTS)

    out, routed, weights, ids = inputs[0]

    def torch_impl() -> None:
        valid = (ids >= 0) & (ids < NUM_EXPERTS)
        out.copy_((torch.where(valid, weights, 0)[..., None] * routed.float()).sum(1))

    ms = device_ms(step, reps=30)
    nbytes = m * topk * hidden * el.itemsize + m * topk * 8 + m * hidden * out_t.itemsize
    result = {
        "params": params,
        "m": m,
        "ms": ms,
        "gbps": nbytes / ms / 1e6,
        "torch_ms": device_ms(torch_impl, reps=10),
        "bytes": nbytes,
        "same_size_copy_ms": same_size_copy_ms(nbytes, sets),
    }
    if m <= 64:  # latency-bound: per-launch time inside a graph, without launch gaps
        result["graph_us"] = graph_us(step)
        result["torch_graph_us"] = graph_us(torch_impl)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--all-variants",
        type=int,
        metavar="M",
        default=0,
        help="instead of the fixed cases, every moe.topk_sum variant of this GPU's arch at M tokens",
    )
    opts = parser.parse_args()
    torch.cuda.init()
    registry = Registry.open(opts.registry)
    copy = copy_gbps(1 << 30)
    rows = []
    cases = CASES
    if opts.all_variants:
        arch = registry.arch(torch.cuda.current_device())
        cases = [
            (dict(e.params), opts.all_variants)
            for e in sorted(registry.entries(), key=lambda e: sorted(e.params.items()))
            if e.family == "moe.topk_sum" and e.arch == arch
        ]
    for params, m in cases:
        try:
            r = run(registry, params, m)
        except VariantMissError:
            print(f"skipped (not in this registry): {params}")
            continue
        r["of_copy"] = r["gbps"] / copy
        r["of_same_size_copy"] = r["same_size_copy_ms"] / r["ms"]
        rows.append(r)
        p = r["params"]
        graph = (
            f"; in a graph {r['graph_us']:.2f} us vs torch {r['torch_graph_us']:.2f} us"
            if "graph_us" in r
            else ""
        )
        print(
            f"{p['element']}->{p['output']} topk={p['topk']} hidden={p['hidden']} cta={p['cta_threads']} "
            f"tokens/cta={p['tokens_per_cta']} M={m}: "
            f"{r['ms'] * 1e3:.1f} us, {r['gbps']:.0f} GB/s = {r['of_copy']:.0%} of copy ({copy:.0f} GB/s), "
            f"{r['of_same_size_copy']:.0%} of a copy of the same bytes; "
            f"torch {r['torch_ms'] * 1e3:.1f} us{graph}"
        )
    emit({"device": torch.cuda.get_device_name(), "copy_gbps": copy, "runs": rows}, opts.json)
    registry.close()


if __name__ == "__main__":
    main()
