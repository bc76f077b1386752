"""TMA kernel launches and throughput: examples.hopper_gemm from the registry against the DSL.

Launch cost (host microseconds per launch, on 128 x 128 x 64 fp16 operands, one process):

- ``bare``: ``cuLaunchKernelEx`` on a buffer packed once (the maps encoded already);
- ``floor``: ``bare`` after reading each tensor's pointer, shape and strides, the least any
  launch from torch tensors does;
- ``prepared``: the registry's launch on the tensors of its last call (its memo's buffer);
- ``prepared/new``: the same with its memo and map caches emptied first, so every call
  derives, encodes (``cuTensorMapEncodeTiled`` three times) and packs, as a first launch on
  new buffers does;
- ``checked``: ``checked()`` with cached maps;
- ``dsl/reuse`` and ``dsl/fresh``: the DSL's compiled call of the same class, on wrapped tensors
  made once or per call (``from_dlpack``), as its users call it.

Throughput at 4096^3 fp16 (C fp16): the registry's launch, the DSL's JIT call and torch.matmul,
in TFLOP/s from CUDA-event device times. Ratios are within this run only.

    PYTHONPATH=examples python benchmarks/bench_tma_gemm.py --registry build/examples.db --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import torch
from cuda.bindings import driver as cu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _digest import digest
from _gpu_state import recorded

from b12x_aot.loader import Registry

from _timing import device_ms, emit, floor_path, host_us_per_call, ratio_table

PARAMS = {"ab": "fp16", "out": "fp16", "tile_n": 128, "stages": 4}
SMALL, LARGE = (128, 128, 64), (4096, 4096, 4096)


def _operands(m: int, n: int, k: int) -> list[torch.Tensor]:
    return [
        torch.randn(m, k, device="cuda").half(),
        torch.randn(n, k, device="cuda").half(),
        torch.empty(m, n, device="cuda").half(),
    ]


def _bare(launch, kernel, tensors, stream):
    """``cuLaunchKernelEx`` straight on a copy of the prepared launch's packed buffer."""
    buf = ctypes.create_string_buffer(launch.packed(*tensors), launch.layout.size)
    argv = (ctypes.c_void_p * len(launch.layout.offsets))(
        *(ctypes.addressof(buf) + o for o in launch.layout.offsets)
    )
    static = kernel.static
    m, n, _ = SMALL
    grid = launch.entry.geometry.grid_of({**PARAMS, "m": m, "n": n})
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = static.cluster
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = static.block
    config.sharedMemBytes, config.hStream = static.smem, stream
    config.attrs, config.numAttrs = [attr], 1
    func, argv_addr = kernel.function(0), ctypes.addressof(argv)

    def bare(keep=(buf, argv, attr)) -> None:  # the buffer and its pointers live as long as the path
        cu.cuLaunchKernelEx(config, func, argv_addr, 0)

    return bare


def _fresh(launch, tensors, stream):
    """The prepared launch with its memo and map caches emptied first: every call derives,
    encodes and packs anew, as the first launch on new pointers does."""
    env = type(launch).__call__.__globals__
    caches = [v for k, v in env.items() if k.startswith("_m") and isinstance(v, dict)]
    memo = env["store"].__self__

    def fresh() -> None:
        memo.clear()
        for cache in caches:
            cache.clear()
        launch(*tensors, stream=stream)

    return fresh


def _dsl(tensors, stream):
    """The DSL's compiled call of the same class, or None without the DSL."""
    try:
        import cutlass
        import cutlass.cute as cute
        from cutlass.cute.runtime import from_dlpack
        from dsl_examples.hopper_gemm import HopperGemm
    except ImportError:
        print("CuTe DSL or examples/ not importable: skipping the dsl/* paths", file=sys.stderr)
        return None
    gemm = HopperGemm(cutlass.Float32, (128, PARAMS["tile_n"], 64), (2, 1, 1), PARAMS["stages"])

    def wrap(values):
        return [
            from_dlpack(t, assumed_align=16).mark_compact_shape_dynamic(
                mode=1, stride_order=(0, 1), divisibility=8
            )
            for t in values
        ]

    def compile_for(values):
        # Mode 0 stays static in the DSL's own marking, so each problem size compiles anew.
        return cute.compile(gemm, *wrap(values), stream)

    return compile_for, wrap


def _rounds(paths: dict, sync, batch: int, batches: int) -> tuple[dict, dict, dict]:
    """Per path, each round's median and the median round; with every batch's us per call
    (``samples_us``: per path, per round) and the GPU's state before and after."""
    results: dict[str, list[float]] = {}
    samples: dict[str, list[list[float]]] = {}
    with recorded(torch.cuda.current_device()) as states:
        for _ in range(3):  # paths interleave over rounds, so drift affects all alike
            for name, fn in paths.items():
                r = host_us_per_call(fn, sync, batch=batch, batches=batches, raw=True)
                results.setdefault(name, []).append(r["median_us"])
                samples.setdefault(name, []).append(r["samples_us"])
    medians = {name: sorted(v)[1] for name, v in results.items()}
    return results, medians, {"samples_us": samples, "gpu_state": states}


def _throughput(launch, dsl, stream, seed: int) -> dict:
    """TFLOP/s of every path at LARGE on operands seeded with ``seed``, once its output agrees
    with torch.matmul; with each output's digest, every rep's ms and the GPU's state around."""
    torch.manual_seed(seed)
    large = _operands(*LARGE)
    flops = 2 * LARGE[0] * LARGE[1] * LARGE[2]
    runs = {
        "registry": lambda: launch(*large),
        "torch.matmul": lambda: torch.matmul(large[0], large[1].t(), out=large[2]),
    }
    if dsl is not None:
        compile_for, wrap = dsl
        big, compiled_large = wrap(large), compile_for(large)
        runs["dsl"] = lambda: compiled_large(*big, stream)
    outputs = {}
    for name, fn in runs.items():  # every path must compute the same product before it is timed
        large[2].zero_()
        fn()
        outputs[name] = large[2].clone()
    reference = outputs["torch.matmul"].float()
    agree = {n: bool(torch.allclose(o.float(), reference, rtol=1e-2, atol=1e-1)) for n, o in outputs.items()}
    print(
        "outputs agree with torch.matmul: "
        + ", ".join(f"{n} {'yes' if ok else 'NO'}" for n, ok in agree.items())
    )
    samples: dict[str, list[float]] = {}
    with recorded(torch.cuda.current_device()) as states:
        tflops = {
            name: flops / device_ms(fn, reps=30, samples=samples.setdefault(name, [])) / 1e9
            for name, fn in runs.items()
            if agree[name]
        }
    return {
        "tflops": tflops,
        "outputs_agree": agree,
        "output_digests": {name: digest(o) for name, o in outputs.items()},
        "throughput_samples_ms": samples,
        "throughput_gpu_state": states,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True, help="a build of examples/specs for sm_90a")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the operands (their outputs' digests compare)"
    )
    opts = parser.parse_args()

    torch.cuda.init()
    stream_t = torch.cuda.Stream()
    torch.cuda.set_stream(stream_t)
    stream = cu.CUstream(stream_t.cuda_stream)
    with Registry.open(opts.registry) as registry:
        kernel = registry.kernel("examples.hopper_gemm", 1, **PARAMS)
        launch = kernel.prepare()
        small = _operands(*SMALL)
        bare = _bare(launch, kernel, small, stream)
        paths = {
            "bare": bare,
            "floor": floor_path(bare, small),
            "prepared": lambda: launch(*small, stream=stream),
            "prepared/new": _fresh(launch, small, stream),
            "checked": lambda: launch.checked(*small, stream=stream),
        }
        dsl = _dsl(small, stream)
        if dsl is not None:
            compile_for, wrap = dsl
            compiled = compile_for(small)
            wrapped = wrap(small)
            paths["dsl/reuse"] = lambda: compiled(*wrapped, stream)
            paths["dsl/fresh"] = lambda: compiled(*wrap(small), stream)
        rounds, medians, launch_series = _rounds(paths, stream_t.synchronize, opts.batch, opts.batches)
        print(f"examples.hopper_gemm {PARAMS} on {SMALL}, {torch.cuda.get_device_name()}:")
        print(ratio_table([(n, medians[n]) for n in paths], unit="us/launch", base="bare"))
        own = medians["prepared"] - medians["floor"]
        print(f"the loader's own host cost over the floor: {own:.2f} us/launch")

        throughput = _throughput(launch, dsl, stream, opts.seed)
    tflops, agree = throughput["tflops"], throughput["outputs_agree"]
    print(f"\n{LARGE} fp16: " + ", ".join(f"{n} {v:.1f} TFLOP/s" for n, v in tflops.items()))
    checks = {
        "prepared_within_1.2x_bare": medians["prepared"] <= 1.2 * medians["bare"],
        "outputs_agree": all(agree.values()),
    }
    if "dsl" in tflops:
        checks["registry_within_2pct_of_dsl_tflops"] = tflops["registry"] >= 0.98 * tflops["dsl"]
    for name, ok in checks.items():
        print(f"{name}: {'yes' if ok else 'NO'}")
    emit(
        {
            "device": torch.cuda.get_device_name(),
            "params": PARAMS,
            "shape": SMALL,
            "us_per_launch": medians,
            "rounds": rounds,
            "ratio_to_bare": {k: v / medians["bare"] for k, v in medians.items()},
            "samples_us": launch_series["samples_us"],
            "gpu_state": launch_series["gpu_state"],
            **throughput,
            "checks": checks,
        },
        opts.json,
    )


if __name__ == "__main__":
    main()
