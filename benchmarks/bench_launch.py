"""Host cost per launch: the loader's prepared launch against every alternative, in one run.

Paths, all launching the same moe.topk_sum variant with tiny work (M=1):
  bare        cuda.bindings cuLaunchKernel with a prebuilt argument buffer
  pack+bare   struct.pack_into of the arguments, then that call
  prepared    PreparedLaunch with int pointers and an explicit stream
  prepared/t  PreparedLaunch with torch tensors and torch's current stream (the serving default)
  checked     PreparedLaunch.checked (validates every argument first)
  dsl/reuse   the CuTe DSL compiled function, arguments built once      (needs the DSL)
  dsl/fresh   the CuTe DSL compiled function, new pointer objects per call (b12x's pattern)
  torch.add   torch.add(a, b, out=c): one torch kernel launch, for scale
and graph replay: the same launch captured 128 times in a CUDA graph, per node.

    python benchmarks/bench_launch.py --registry build/kernels.db --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import struct
import sys
from pathlib import Path

import torch
from cuda.bindings import driver as cu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from b12x_aot.loader import Registry

from _timing import emit, host_us_per_call, ratio_table

PARAMS = {
    "element": "bf16",
    "output": "bf16",
    "topk": 8,
    "hidden": 2048,
    "cta_threads": 256,
    "tokens_per_cta": 1,
}
NUM_EXPERTS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()

    torch.cuda.init()
    registry = Registry.open(opts.registry)
    kernel = registry.kernel("moe.topk_sum", 1, **PARAMS)
    launch = kernel.prepare()
    m, topk, hidden = 1, PARAMS["topk"], PARAMS["hidden"]
    out = torch.empty(m, hidden, device="cuda", dtype=torch.bfloat16)
    routed = torch.randn(m, topk, hidden, device="cuda").bfloat16()
    weights = torch.rand(m, topk, device="cuda")
    ids = torch.randint(0, NUM_EXPERTS, (m, topk), device="cuda", dtype=torch.int32)
    tensors = (out, routed, weights, ids)
    ints = [t.data_ptr() for t in tensors] + [m, NUM_EXPERTS]
    stream_t = torch.cuda.Stream()
    torch.cuda.set_stream(stream_t)
    stream = cu.CUstream(stream_t.cuda_stream)
    sync = stream_t.synchronize

    func = kernel.function(0)
    buf = ctypes.create_string_buffer(launch.layout.size)
    argv = (ctypes.c_void_p * len(launch.layout.offsets))(
        *(ctypes.addressof(buf) + o for o in launch.layout.offsets)
    )
    argv_addr = ctypes.addressof(argv)
    pack = struct.Struct(launch.layout.fmt).pack_into
    pack(buf, 0, *ints)
    grid = kernel.entry.geometry.grid_of({**PARAMS, "num_tokens": m, "num_experts": NUM_EXPERTS})
    block = (PARAMS["cta_threads"], 1, 1)

    def bare() -> None:
        cu.cuLaunchKernel(func, *grid, *block, 0, stream, argv_addr, 0)

    def pack_bare() -> None:
        pack(buf, 0, *ints)
        cu.cuLaunchKernel(func, *grid, *block, 0, stream, argv_addr, 0)

    paths = {
        "bare": bare,
        "pack+bare": pack_bare,
        "prepared": lambda: launch(*ints, stream=stream),
        "prepared/t": lambda: launch(*tensors, m, NUM_EXPERTS),
        "checked": lambda: launch.checked(*tensors, m, NUM_EXPERTS),
    }
    paths.update(_dsl_paths(kernel, tensors, m, stream))
    a, b, c = (torch.randn(1024, device="cuda") for _ in range(3))
    paths["torch.add"] = lambda: torch.add(a, b, out=c)

    results = {}
    # Interleave the paths over several rounds so drift affects all of them alike.
    rounds = 3
    per_round = max(opts.batches // rounds, 10)
    for _ in range(rounds):
        for name, fn in paths.items():
            r = host_us_per_call(fn, sync, batch=opts.batch, batches=per_round)
            results.setdefault(name, []).append(r["median_us"])
    medians = {name: sorted(v)[len(v) // 2] for name, v in results.items()}

    graph_us = _graph_node_us(launch, tensors, m, stream_t, opts.batch)
    rows = [(name, medians[name]) for name in paths]
    print(ratio_table(rows, unit="us/launch", base="bare"))
    print(f"graph replay: {graph_us:.2f} us per node")
    checks = {
        "prepared_within_1.2x_bare": medians["prepared"] <= 1.2 * medians["bare"],
        "prepared_t_within_1.2x_bare": medians["prepared/t"] <= 1.2 * medians["bare"],
    }
    if "dsl/fresh" in medians:
        checks["dsl_fresh_over_2.5x_prepared"] = medians["dsl/fresh"] >= 2.5 * medians["prepared"]
        checks["dsl_reuse_over_1.8x_prepared"] = medians["dsl/reuse"] >= 1.8 * medians["prepared"]
    for name, ok in checks.items():
        print(f"{name}: {'yes' if ok else 'NO'}")
    emit(
        {
            "device": torch.cuda.get_device_name(),
            "params": PARAMS,
            "us_per_launch": medians,
            "rounds": results,
            "ratio_to_bare": {k: v / medians["bare"] for k, v in medians.items()},
            "graph_us_per_node": graph_us,
            "checks": checks,
        },
        opts.json,
    )
    registry.close()


def _graph_node_us(launch, tensors, m: int, stream_t, nodes: int) -> float:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream_t):
        for _ in range(nodes):
            launch(*tensors, m, NUM_EXPERTS)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 50
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * nodes)


def _dsl_paths(kernel, tensors, m: int, stream) -> dict:
    """The CuTe DSL's compiled-function call of the same kernel, if the DSL is importable."""
    try:
        import cutlass
        import cutlass.cute as cute
        from cutlass.cute.runtime import make_ptr

        from b12x_aot.kernels import dsl_dtype
        from b12x_aot.kernels.topk_sum import TopKSum
    except ImportError:
        print("CuTe DSL not importable: skipping the dsl/* paths", file=sys.stderr)
        return {}
    entry = kernel.entry

    def ptrs():
        return [
            make_ptr(dsl_dtype(a.dtype), t.data_ptr(), cute.AddressSpace.gmem, assumed_align=a.align)
            for a, t in zip(entry.args[:4], tensors, strict=True)
        ]

    obj = TopKSum(entry.geometry, entry.static, **entry.params)
    compiled = cute.compile(obj, *ptrs(), cutlass.Int32(m), cutlass.Int32(NUM_EXPERTS), stream)
    reused = [*ptrs(), cutlass.Int32(m), cutlass.Int32(NUM_EXPERTS), stream]
    return {
        "dsl/reuse": lambda: compiled(*reused),
        "dsl/fresh": lambda: compiled(*ptrs(), cutlass.Int32(m), cutlass.Int32(NUM_EXPERTS), stream),
    }


if __name__ == "__main__":
    main()
