"""comm.allreduce latency per call: every built variant and payload, eagerly and in a CUDA graph.

Payloads are 1 KiB .. 8 MiB (powers of two) of bf16 (or --dtype fp16). For each variant the
median and p90 of the device time of one call, measured with CUDA events around each of
back-to-back calls (eager), and of one replay of a graph of N back-to-back calls divided by N
(graph).

Mode 1, one process (the default): virtual ranks on ONE GPU, every rank a stream. This times
the protocol, not the interconnect; it is labelled as such in the output and the JSON.

    python benchmarks/bench_allreduce.py --registry build/kernels.db --world 2,4,8 --json out.json

Mode 2, one process per GPU, started by the launcher; also times torch.distributed's NCCL
all_reduce on the same ranks in the same run (NVLink multicast off) and prints the ratio:

    python -m b12x_aot.comm.launch --nproc 8 benchmarks/bench_allreduce.py --registry build/kernels.db
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

# Virtual ranks run one spinning kernel per stream: every stream needs its own hardware queue.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from b12x_aot.comm import ENV_RANK, Communicator, Policy, create_local_group, read_launch_env
from b12x_aot.comm._policy import ABI, FAMILY
from b12x_aot.loader import Registry

from _timing import emit, ratio_table

VIRTUAL = "virtual ranks on one GPU — not a multi-GPU figure"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SIZES = [1 << k for k in range(10, 24)]  # 1 KiB .. 8 MiB
COMBOS = [(a, t) for a in ("oneshot", "twoshot") for t in ("pull", "push")]


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_us": statistics.median(ordered), "p90_us": ordered[int(0.9 * (len(ordered) - 1))]}


def eager_us(call: Callable[[], None], reps: int) -> dict[str, float]:
    """Per-call device µs: an event pair around each of ``reps`` back-to-back calls."""
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)
    ]
    for start, end in events:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return percentiles([s.elapsed_time(e) * 1e3 for s, e in events])


def graph_us(call: Callable[[], None], calls: int, replays: int) -> dict[str, float]:
    """Per-call device µs from replays of one graph of ``calls`` back-to-back calls."""
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        call()
    torch.cuda.current_stream().wait_stream(capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        for _ in range(calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return percentiles(samples)


def virtual_call(comms: list[Communicator], inputs, outputs, algorithm: str, transport: str):
    """One all-reduce of every virtual rank: fork to the ranks' streams, launch, join."""
    streams = [torch.cuda.ExternalStream(c.stream) for c in comms]

    def call() -> None:
        main = torch.cuda.current_stream()
        for stream in streams:
            stream.wait_stream(main)
        for comm, stream, inp, out in zip(comms, streams, inputs, outputs, strict=True):
            comm.all_reduce(inp, out, stream=stream, algorithm=algorithm, transport=transport)
        for stream in streams:
            main.wait_stream(stream)

    return call


def shapes(registry: Registry, world: int, opts: argparse.Namespace) -> list[tuple[int, int]]:
    """The (cta_threads, blocks) pairs to time: every built one with --all-shapes, else the
    default policy's (the communicator falls back to the nearest built pair)."""
    if not opts.all_shapes:
        return [(Policy().cta_threads, Policy().blocks)]
    arch = registry.arch(torch.cuda.current_device())
    found = set()
    for e in registry.entries():
        p = e.params
        if (
            e.family == FAMILY
            and e.abi == ABI
            and e.arch == arch
            and p["world"] == world
            and p["dtype"] == opts.dtype
        ):
            found.add((p["cta_threads"], p["blocks"]))
    return sorted(found)


def bench_virtual(registry: Registry, opts: argparse.Namespace) -> dict:
    print(f"*** {VIRTUAL.upper()} ***")
    print("eager: one host thread issues every rank's launch, so it is bound by the host's issue rate;")
    print("graph: device time per call with no launch gaps")
    dtype = DTYPES[opts.dtype]
    runs = []
    for world in opts.world:
        for threads, blocks in shapes(registry, world, opts):
            comms = create_local_group(
                registry,
                world=world,
                capacity_bytes=max(SIZES),
                dtypes=(opts.dtype,),
                policy=Policy(cta_threads=threads, blocks=blocks),
            )
            try:
                for algorithm, transport in COMBOS:
                    if (opts.dtype, algorithm, transport) not in comms[0].variants:
                        continue
                    for nbytes in SIZES:
                        n = nbytes // dtype.itemsize
                        inputs = [torch.randn(n, device="cuda").to(dtype) for _ in range(world)]
                        outputs = [torch.empty_like(inputs[0]) for _ in range(world)]
                        call = virtual_call(comms, inputs, outputs, algorithm, transport)
                        row = {
                            "world": world,
                            "variant": label(comms[0], opts.dtype, algorithm, transport),
                            "bytes": nbytes,
                            "eager": eager_us(call, opts.reps),
                            "graph": graph_us(call, opts.graph_calls, opts.replays),
                        }
                        runs.append(row)
                        print(line(row))
                for comm in comms:
                    comm.check()
            finally:
                for comm in comms:
                    comm.close()
    note = "eager is bound by one host thread issuing every rank; graph is device time per call"
    return {
        "mode": VIRTUAL,
        "note": note,
        "device": torch.cuda.get_device_name(),
        "dtype": opts.dtype,
        "runs": runs,
    }


def label(comm: Communicator, dtype: str, algorithm: str, transport: str) -> str:
    """The variant actually launched (the policy's shape, or the nearest built one)."""
    v = comm.variants[(dtype, algorithm, transport)]
    return f"{algorithm}/{transport} cta={v.cta_threads} blocks={v.blocks}"


def line(row: dict) -> str:
    text = (
        f"world={row['world']} {row['variant']:<32} {row['bytes']:>8} B  eager {row['eager']['median_us']:7.2f} "
        f"(p90 {row['eager']['p90_us']:7.2f}) us  graph {row['graph']['median_us']:7.2f} "
        f"(p90 {row['graph']['p90_us']:7.2f}) us"
    )
    if "nccl_eager" in row:
        graph = row["nccl_graph"].get("median_us", float("nan"))
        text += f"  nccl {row['nccl_eager']['median_us']:7.2f} / graph {graph:7.2f} us"
    return text


def bench_processes(registry: Registry, opts: argparse.Namespace) -> dict:
    import torch.distributed as dist

    env = read_launch_env()
    torch.cuda.set_device(env.device)
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast, even if the caller's env says so
    store = dist.FileStore(os.path.join(os.path.dirname(env.rendezvous), "nccl.store"), env.world)
    dist.init_process_group(
        "nccl", store=store, rank=env.rank, world_size=env.world, device_id=torch.device("cuda", env.device)
    )
    dtype = DTYPES[opts.dtype]
    say = print if env.rank == 0 else (lambda *a, **k: None)
    runs = []
    try:
        for threads, blocks in shapes(registry, env.world, opts):
            with Communicator.from_env(
                registry,
                max(SIZES),
                dtypes=(opts.dtype,),
                policy=Policy(cta_threads=threads, blocks=blocks),
            ) as comm:
                for nbytes in SIZES:
                    n = nbytes // dtype.itemsize
                    inp = torch.randn(n, device="cuda").to(dtype)
                    out = torch.empty_like(inp)
                    nccl_buf = inp.clone()
                    nccl = {"nccl_eager": eager_us(lambda b=nccl_buf: dist.all_reduce(b), opts.reps)}
                    try:
                        nccl["nccl_graph"] = graph_us(
                            lambda b=nccl_buf: dist.all_reduce(b), opts.graph_calls, opts.replays
                        )
                    except RuntimeError as exc:  # recorded in the JSON and printed, never dropped
                        nccl["nccl_graph"] = {"error": str(exc)}
                        say(f"NCCL all_reduce could not be captured in a CUDA graph: {exc}")
                    size_rows = []
                    for algorithm, transport in COMBOS:
                        if (opts.dtype, algorithm, transport) not in comm.variants:
                            continue

                        def call(a=algorithm, t=transport, i=inp, o=out) -> None:
                            comm.all_reduce(i, o, algorithm=a, transport=t)

                        row = {
                            "world": env.world,
                            "variant": label(comm, opts.dtype, algorithm, transport),
                            "bytes": nbytes,
                            "eager": eager_us(call, opts.reps),
                            "graph": graph_us(call, opts.graph_calls, opts.replays),
                            **nccl,
                        }
                        runs.append(row)
                        size_rows.append(row)
                        say(line(row))
                    for kind in ("eager", "graph"):
                        base = nccl[f"nccl_{kind}"].get("median_us")
                        if base is None:
                            continue
                        table = [(f"nccl {kind}", base)]
                        table += [(f"{r['variant']} {kind}", r[kind]["median_us"]) for r in size_rows]
                        text = ratio_table(table, unit="us", base=f"nccl {kind}")
                        say(f"\n{nbytes} bytes, world {env.world}, {kind}:\n{text}\n")
                comm.check()
    finally:
        dist.destroy_process_group()
    mode = f"{env.world} processes, one GPU each"
    return {
        "mode": mode,
        "device": torch.cuda.get_device_name(),
        "dtype": opts.dtype,
        "runs": runs,
        "rank": env.rank,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--world", default="2,4,8", help="virtual-rank world sizes (mode 1)")
    parser.add_argument("--reps", type=int, default=200, help="timed eager calls per point")
    parser.add_argument("--graph-calls", type=int, default=20, help="calls captured in one graph")
    parser.add_argument("--replays", type=int, default=30, help="timed graph replays per point")
    parser.add_argument("--all-shapes", action="store_true", help="every built cta_threads/blocks pair")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    opts.world = [int(w) for w in opts.world.split(",")]
    torch.cuda.init()
    registry = Registry.open(opts.registry)
    try:
        if ENV_RANK in os.environ:
            result = bench_processes(registry, opts)
            if result["rank"] == 0:
                emit(result, opts.json)
        else:
            emit(bench_virtual(registry, opts), opts.json)
    finally:
        torch.cuda.synchronize()
        registry.close()


if __name__ == "__main__":
    main()
