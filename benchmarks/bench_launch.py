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

With ``--examples-registry`` (a build of ``examples/specs``), the same paths for two kernels
that take ``cute.Tensor`` arguments, with torch tensors: ``examples.elementwise`` (its host
function derives tiled extents and strides, so its parameters are computed words) and
``examples.tensorop_gemm`` (its tensors passed as given). ``bare`` there launches a buffer
packed once; ``floor`` is ``bare`` after reading each tensor's pointer, shape and strides, the
least any launch from torch tensors does; ``dsl/*`` calls the DSL's compiled function with
``from_dlpack`` tensors.

    python benchmarks/bench_launch.py --registry build/kernels.db --json out.json
    PYTHONPATH=examples python benchmarks/bench_launch.py --registry build/kernels.db \
        --examples-registry build/examples.db
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
from _gpu_state import recorded

from b12x_aot.loader import Registry

from _timing import emit, floor_path, host_us_per_call, ratio_table

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
    parser.add_argument("--examples-registry", default=None, help="a build of examples/specs")
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

    results, medians, series = _interleaved(paths, sync, opts)

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
    tensor_kernels = _tensor_kernels(opts, stream, sync, checks) if opts.examples_registry else {}
    for name, ok in checks.items():
        print(f"{name}: {'yes' if ok else 'NO'}")
    emit(
        {
            "device": torch.cuda.get_device_name(),
            "params": PARAMS,
            "us_per_launch": medians,
            "rounds": results,
            **series,
            "ratio_to_bare": {k: v / medians["bare"] for k, v in medians.items()},
            "graph_us_per_node": graph_us,
            "tensor_kernels": tensor_kernels,
            "checks": checks,
        },
        opts.json,
    )
    registry.close()


def _tensor_kernels(opts, stream, sync, checks: dict) -> dict:
    """Every path of each tensor-argument example kernel, printed and checked; their records."""
    tensor_kernels = {}
    with Registry.open(opts.examples_registry) as examples:
        for family, params, shape in TENSOR_KERNELS:
            name = family.removeprefix("examples.")
            t_paths = _tensor_paths(examples.kernel(family, 1, **params), name, params, shape, stream)
            t_rounds, t_medians, t_series = _interleaved(t_paths, sync, opts)
            print(f"\n{family} {params} on {shape}, torch tensors:")
            print(ratio_table([(n, t_medians[n]) for n in t_paths], unit="us/launch", base=f"{name}/bare"))
            bare_us = t_medians[f"{name}/bare"]
            own = t_medians[f"{name}/prepared"] - t_medians[f"{name}/floor"]
            print(f"{name}: the loader's own host cost over the floor: {own:.2f} us/launch")
            checks[f"{name}_prepared_within_1.15x_bare"] = t_medians[f"{name}/prepared"] <= 1.15 * bare_us
            checks[f"{name}_checked_within_2x_bare"] = t_medians[f"{name}/checked"] <= 2 * bare_us
            tensor_kernels[family] = {
                "params": params,
                "shape": shape,
                "us_per_launch": t_medians,
                "rounds": t_rounds,
                "ratio_to_bare": {k: v / bare_us for k, v in t_medians.items()},
                **t_series,
            }
    return tensor_kernels


def _interleaved(paths: dict, sync, opts) -> tuple[dict, dict, dict]:
    """Per path, the median host us per call of each round, and the median round; the paths
    interleave over the rounds so drift affects all of them alike. Also every batch's us per
    call (``samples_us``: per path, per round) and the GPU's state before and after."""
    results: dict[str, list[float]] = {}
    samples: dict[str, list[list[float]]] = {}
    rounds = 3
    per_round = max(opts.batches // rounds, 10)
    with recorded(torch.cuda.current_device()) as states:
        for _ in range(rounds):
            for name, fn in paths.items():
                r = host_us_per_call(fn, sync, batch=opts.batch, batches=per_round, raw=True)
                results.setdefault(name, []).append(r["median_us"])
                samples.setdefault(name, []).append(r["samples_us"])
    medians = {name: sorted(v)[len(v) // 2] for name, v in results.items()}
    return results, medians, {"samples_us": samples, "gpu_state": states}


# tensor-argument kernels: (family, params, operand shapes (m, n) or (m, n, k))
TENSOR_KERNELS = [
    ("examples.elementwise", {"dtype": "fp32", "op": "add", "threads": 128}, (4, 128)),
    (
        "examples.tensorop_gemm",
        {"ab": "fp16", "out": "fp32", "tile_m": 64, "tile_n": 128, "stages": 3},
        (64, 128, 64),
    ),
]


def _tensor_paths(kernel, name: str, params: dict, shape: tuple, stream) -> dict:
    """bare, prepared, checked and (with the DSL) its compiled call, for one tensor kernel."""
    if len(shape) == 2:
        tensors = [torch.randn(shape, device="cuda") for _ in range(3)]
    else:
        m, n, k = shape
        tensors = [
            torch.randn(m, k, device="cuda").half(),
            torch.randn(n, k, device="cuda").half(),
            torch.empty(m, n, device="cuda"),
        ]
    launch = kernel.prepare()
    buf = ctypes.create_string_buffer(launch.packed(*tensors), launch.layout.size)
    argv = (ctypes.c_void_p * len(launch.layout.offsets))(
        *(ctypes.addressof(buf) + o for o in launch.layout.offsets)
    )
    argv_addr, func, static = ctypes.addressof(argv), kernel.function(0), kernel.static
    grid = launch.entry.geometry.grid_of({**params, **dict(zip(("m", "n", "k"), shape, strict=False))})

    def bare(keep=(buf, argv)) -> None:  # the buffer and its pointers live as long as the path
        cu.cuLaunchKernel(func, *grid, *static.block, static.smem, stream, argv_addr, 0)

    paths = {
        f"{name}/bare": bare,
        f"{name}/floor": floor_path(bare, tensors),
        f"{name}/prepared": lambda: launch(*tensors),
        f"{name}/checked": lambda: launch.checked(*tensors),
    }
    paths.update(_dsl_tensor_paths(name, params, tensors, stream))
    return paths


def _dsl_tensor_paths(name: str, params: dict, tensors: list, stream) -> dict:
    """The DSL's compiled call of the same class, with ``from_dlpack`` tensors."""
    try:
        import cutlass
        import cutlass.cute as cute
        from cutlass.cute.runtime import from_dlpack
        from dsl_examples.elementwise import ElementwiseBinary
        from dsl_examples.tensorop_gemm import TensorOpGemm
    except ImportError:
        print("CuTe DSL or examples/ not importable: skipping the dsl/* tensor paths", file=sys.stderr)
        return {}
    if name == "elementwise":
        obj = ElementwiseBinary(op=params["op"], threads=params["threads"])

        def wrap():
            return [from_dlpack(t).mark_layout_dynamic() for t in tensors]
    else:
        obj = TensorOpGemm(
            cutlass.Float32, (params["tile_m"], params["tile_n"], 32), (2, 2, 1), params["stages"]
        )

        def wrap():
            return [
                from_dlpack(t, assumed_align=16).mark_compact_shape_dynamic(
                    mode=1, stride_order=(0, 1), divisibility=8
                )
                for t in tensors
            ]

    compiled = cute.compile(obj, *wrap(), stream)
    reused = wrap()
    return {
        f"{name}/dsl/reuse": lambda: compiled(*reused, stream),
        f"{name}/dsl/fresh": lambda: compiled(*wrap(), stream),
    }


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
