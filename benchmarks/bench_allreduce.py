"""comm.allreduce latency per call: every built variant and payload, eagerly and in a CUDA graph.

Payloads are 1 KiB .. 8 MiB (powers of two) of bf16 (or --dtype fp16). For each variant the
median and p90 of the device time of one call, measured with CUDA events around each of
back-to-back calls (eager), and of one replay of a graph of N back-to-back calls divided by N
(graph).

Mode 1, one process (the default): virtual ranks on ONE GPU, every rank a stream. This times
the protocol, not the interconnect; it is labelled as such in the output and the JSON.

    python benchmarks/bench_allreduce.py --registry build/kernels.db --world 2,4,8 --json out.json

Mode 2, one process per GPU, started by the launcher (any --nproc; a world the registry holds
no variant of times NCCL alone); also times torch.distributed's NCCL all_reduce on the same
ranks in the same run (NVLink multicast off) where torch has NCCL, and prints the ratio:

    python -m b12x_aot.comm.launch --nproc 8 benchmarks/bench_allreduce.py --registry build/kernels.db

Every series (one world and CTA shape) records each GPU's state before and after (NVML:
clocks, temperature, power, throttle reasons; every rank its own) and prints it beside the
latencies. Rank r's input is randn seeded with --seed + r, in both modes, and every output's
sha256 is recorded, so runs in different processes and modes compare bit for bit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Virtual ranks run one spinning kernel per stream: every stream needs its own hardware queue.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _digest import digest
from _gpu_state import from_json, recorded, sample

from b12x_aot.comm import ENV_RANK, Communicator, Policy, create_local_group, read_launch_env
from b12x_aot.comm._policy import ABI, FAMILY
from b12x_aot.loader import Registry

from _timing import emit, ratio_table

VIRTUAL = "virtual ranks on one GPU — not a multi-GPU figure"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SIZES = [1 << k for k in range(10, 24)]  # 1 KiB .. 8 MiB
COMBOS = [(a, t) for a in ("oneshot", "twoshot") for t in ("pull", "push")]


def percentiles(samples: list[float]) -> dict[str, Any]:
    """Median and p90 of per-call µs, with every sample in the order it was measured."""
    ordered = sorted(samples)
    return {
        "median_us": statistics.median(ordered),
        "p90_us": ordered[int(0.9 * (len(ordered) - 1))],
        "samples_us": samples,
    }


def seeded_input(n: int, dtype: torch.dtype, seed: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input: the same values in either mode and any process."""
    generator = torch.Generator(device="cuda").manual_seed(seed + rank)
    return torch.randn(n, device="cuda", generator=generator).to(dtype)


def show_states(say: Callable[..., None], title: str, states: list[dict], who: str) -> None:
    """One line per state sample: ``rank 0: sm 1980/1980 MHz ... throttle: none``."""
    say(f"GPU state {title}:")
    for rank, state in enumerate(states):
        say(f"  {who if who else f'rank {rank}'}: {from_json(state).line()}")


def eager_us(call: Callable[[], None], reps: int) -> dict[str, Any]:
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


def graph_us(call: Callable[[], None], calls: int, replays: int) -> dict[str, Any]:
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
    device = torch.cuda.current_device()
    runs, series = [], []
    for world in opts.world:
        for threads, blocks in shapes(registry, world, opts):
            comms = create_local_group(
                registry,
                world=world,
                capacity_bytes=max(SIZES),
                dtypes=(opts.dtype,),
                policy=Policy(cta_threads=threads, blocks=blocks),
            )
            title = f"world={world} cta={threads} blocks={blocks}"
            try:
                with recorded(device) as states:
                    show_states(print, f"before {title}", [states["before"]], f"device {device}")
                    runs += virtual_rows(comms, world, opts)
                    for comm in comms:
                        comm.check()
            finally:
                for comm in comms:
                    comm.close()
            show_states(print, f"after {title}", [states["after"]], f"device {device}")
            series.append({"world": world, "cta_threads": threads, "blocks": blocks, "gpu_state": states})
    note = "eager is bound by one host thread issuing every rank; graph is device time per call"
    return {
        "mode": VIRTUAL,
        "note": note,
        "device": torch.cuda.get_device_name(),
        "dtype": opts.dtype,
        "seed": opts.seed,
        "series": series,
        "runs": runs,
    }


def virtual_rows(comms: list[Communicator], world: int, opts: argparse.Namespace) -> list[dict]:
    """Every built variant at every payload, on one group of virtual ranks."""
    dtype = DTYPES[opts.dtype]
    rows = []
    for algorithm, transport in COMBOS:
        if (opts.dtype, algorithm, transport) not in comms[0].variants:
            continue
        for nbytes in SIZES:
            n = nbytes // dtype.itemsize
            inputs = [seeded_input(n, dtype, opts.seed, rank) for rank in range(world)]
            outputs = [torch.empty_like(inputs[0]) for _ in range(world)]
            call = virtual_call(comms, inputs, outputs, algorithm, transport)
            call()  # the digest is of one call on fresh outputs, before any timing
            torch.cuda.synchronize()
            digests = [digest(out) for out in outputs]
            row = {
                "world": world,
                "variant": label(comms[0], opts.dtype, algorithm, transport),
                "bytes": nbytes,
                "digest": digests[0],
                "ranks_agree": len(set(digests)) == 1,
                "eager": eager_us(call, opts.reps),
                "graph": graph_us(call, opts.graph_calls, opts.replays),
            }
            rows.append(row)
            print(line(row))
    return rows


def label(comm: Communicator, dtype: str, algorithm: str, transport: str) -> str:
    """The variant actually launched (the policy's shape, or the nearest built one)."""
    v = comm.variants[(dtype, algorithm, transport)]
    return f"{algorithm}/{transport} cta={v.cta_threads} blocks={v.blocks}"


def line(row: dict) -> str:
    text = f"world={row['world']} {row['variant']:<32} {row['bytes']:>8} B"
    if "eager" in row:
        text += (
            f"  eager {row['eager']['median_us']:7.2f} (p90 {row['eager']['p90_us']:7.2f}) us"
            f"  graph {row['graph']['median_us']:7.2f} (p90 {row['graph']['p90_us']:7.2f}) us"
        )
    if "nccl_eager" in row:
        graph = row["nccl_graph"].get("median_us", float("nan"))
        text += f"  nccl {row['nccl_eager']['median_us']:7.2f} / graph {graph:7.2f} us"
    if not row.get("ranks_agree", True):
        text += "  OUTPUTS DIFFER BETWEEN RANKS"
    if not row.get("nccl_ranks_agree", True):
        text += "  NCCL OUTPUTS DIFFER BETWEEN RANKS"
    return text


def gather(dist, obj) -> list:
    """``obj`` of every rank, in rank order."""
    objs = [None] * dist.get_world_size()
    dist.all_gather_object(objs, obj)
    return objs


def holds_world(registry: Registry, world: int, dtype: str) -> bool:
    arch = registry.arch(torch.cuda.current_device())
    return any(
        e.family == "comm.allreduce"
        and e.arch == arch
        and e.params["world"] == world
        and e.params["dtype"] == dtype
        for e in registry.entries()
    )


def bench_processes(registry: Registry, opts: argparse.Namespace) -> dict:
    import torch.distributed as dist

    env = read_launch_env()
    torch.cuda.set_device(env.device)
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast, even if the caller's env says so
    nccl = dist.is_nccl_available()
    store = dist.FileStore(os.path.join(os.path.dirname(env.rendezvous), "nccl.store"), env.world)
    extra = {"device_id": torch.device("cuda", env.device)} if nccl else {}
    dist.init_process_group(
        "nccl" if nccl else "gloo", store=store, rank=env.rank, world_size=env.world, **extra
    )
    say = print if env.rank == 0 else (lambda *a, **k: None)
    if not nccl:
        say("torch.distributed has no NCCL here: timing comm.allreduce alone")
    built = shapes(registry, env.world, opts) if holds_world(registry, env.world, opts.dtype) else []
    if not built:
        say(f"the registry holds no comm.allreduce for world {env.world} ({opts.dtype}): timing NCCL alone")
    runs, series = [], []
    try:
        for shape in built or [None]:
            opened = (
                contextlib.nullcontext()
                if shape is None
                else Communicator.from_env(
                    registry,
                    max(SIZES),
                    dtypes=(opts.dtype,),
                    policy=Policy(cta_threads=shape[0], blocks=shape[1]),
                )
            )
            title = f"world={env.world}" + ("" if shape is None else f" cta={shape[0]} blocks={shape[1]}")
            with opened as comm:
                before = gather(dist, sample(env.device).to_json())
                show_states(say, f"before {title}", before, "")
                for nbytes in SIZES:
                    runs += process_rows(dist, comm, nbytes, nccl, opts, say)
                if comm is not None:
                    comm.check()
                after = gather(dist, sample(env.device).to_json())
                show_states(say, f"after {title}", after, "")
            shape_fields = {} if shape is None else {"cta_threads": shape[0], "blocks": shape[1]}
            series.append(
                {"world": env.world, **shape_fields, "gpu_state": {"before": before, "after": after}}
            )
    finally:
        dist.destroy_process_group()
    return {
        "mode": f"{env.world} processes, one GPU each",
        "device": torch.cuda.get_device_name(),
        "dtype": opts.dtype,
        "seed": opts.seed,
        "nccl": nccl,
        "series": series,
        "runs": runs,
        "rank": env.rank,
    }


def nccl_point(dist, inp: torch.Tensor, opts: argparse.Namespace, say) -> dict:
    """NCCL's all_reduce on a copy of ``inp``: its output's digest, then its eager and graph times."""
    buf = inp.clone()
    dist.all_reduce(buf)
    torch.cuda.synchronize()
    point = {"nccl_digest": digest(buf), "nccl_eager": eager_us(lambda: dist.all_reduce(buf), opts.reps)}
    try:
        point["nccl_graph"] = graph_us(lambda: dist.all_reduce(buf), opts.graph_calls, opts.replays)
    except RuntimeError as exc:  # recorded in the JSON and printed, never dropped
        point["nccl_graph"] = {"error": str(exc)}
        say(f"NCCL all_reduce could not be captured in a CUDA graph: {exc}")
    return point


def process_rows(dist, comm: Communicator | None, nbytes: int, nccl: bool, opts, say) -> list[dict]:
    """NCCL and every built variant at one payload; digests compared over the ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[opts.dtype]
    inp = seeded_input(nbytes // dtype.itemsize, dtype, opts.seed, rank)
    out = torch.empty_like(inp)
    base = nccl_point(dist, inp, opts, say) if nccl else {}
    rows = []
    for algorithm, transport in COMBOS:
        if comm is None or (opts.dtype, algorithm, transport) not in comm.variants:
            continue

        def call(a=algorithm, t=transport) -> None:
            comm.all_reduce(inp, out, algorithm=a, transport=t)

        call()  # the digest is of one call on a fresh output, before any timing
        torch.cuda.synchronize()
        rows.append(
            {"world": world, "variant": label(comm, opts.dtype, algorithm, transport), "bytes": nbytes}
        )
        rows[-1]["digest"] = digest(out)
        rows[-1]["eager"] = eager_us(call, opts.reps)
        rows[-1]["graph"] = graph_us(call, opts.graph_calls, opts.replays)
        rows[-1].update(base)
    if not rows and nccl:
        rows.append({"world": world, "variant": "nccl", "bytes": nbytes, **base})
    everyone = gather(dist, [(r.get("digest"), r.get("nccl_digest")) for r in rows])
    for i, row in enumerate(rows):
        ours, theirs = ({rank_rows[i][j] for rank_rows in everyone} for j in (0, 1))
        if "digest" in row:
            row["ranks_agree"] = len(ours) == 1
        if "nccl_digest" in row:
            row["nccl_ranks_agree"] = len(theirs) == 1
        say(line(row))
    for kind in ("eager", "graph"):
        ref = base.get(f"nccl_{kind}", {}).get("median_us")
        measured = [r for r in rows if kind in r]
        if ref is None or not measured:
            continue
        table = [(f"nccl {kind}", ref)] + [(f"{r['variant']} {kind}", r[kind]["median_us"]) for r in measured]
        say(
            f"\n{nbytes} bytes, world {world}, {kind}:\n{ratio_table(table, unit='us', base=f'nccl {kind}')}\n"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--world", default="2,4,8", help="virtual-rank world sizes (mode 1)")
    parser.add_argument("--reps", type=int, default=200, help="timed eager calls per point")
    parser.add_argument("--graph-calls", type=int, default=20, help="calls captured in one graph")
    parser.add_argument("--replays", type=int, default=30, help="timed graph replays per point")
    parser.add_argument("--all-shapes", action="store_true", help="every built cta_threads/blocks pair")
    parser.add_argument("--seed", type=int, default=0, help="rank r's input is randn seeded with SEED + r")
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
