"""moe.w4a16 (+ moe.route_pack) against the device's copy bandwidth and torch, in one process.

    python benchmarks/bench_w4a16.py --registry build/kernels.db [--json out.json] [--where k=v ...]

For every moe.w4a16 variant of the device's arch in the registry (narrowed by ``--where``):

- **decode**: for each of ``--decode-tokens`` (default 1, 4 and 16 tokens) x topk routed
  uniformly to ``min(--experts, e_cap)`` experts; the weight bandwidth is the int4 weights plus
  scales of the experts actually touched over the GEMM time, with L2 flushed before each launch.
  It is reported against a device-to-device copy measured in the same run (bytes read +
  written), and the GEMM time against a read of the same number of bytes (``torch.sum`` over a
  buffer that size, L2 flushed alike): the decode GEMM's bound. ``CTA/SM`` is the launch's CTAs
  that compute a tile over the SM count. They are equal work, so the busiest SMs run the next
  whole number of them: a launch just past a whole number per SM takes about as long as one at
  the next (on an H200, N 256, the 3-stage four-part tile of 256 threads: 3.15 per SM at 16
  tokens, 38.0 us, 1.26x the read; 3.76 at 20 tokens, 38.6 us, 1.11x; 2.76 at 14 tokens,
  31.1 us, 1.12x), and worst when
  more CTAs than fit on the SMs at once leave a few to start late (N 256 at 16 tokens: the
  2-stage four-part tile 64 wide, 3.15 per SM where three fit, 36.7 us, 1.20x; 128 wide, 1.58
  per SM where two fit, 33.5 us, 1.10x).
- **prefill**: ``--prefill-tokens`` tokens (default 4096); the GEMM time against torch bf16/fp16
  matmuls on pre-dequantized weights, one per expert over its pre-gathered rows (timed eager
  and as a replayed CUDA graph, each with L2 flushed before every launch; the ratio uses the
  faster of the two). The GEMM and torch are timed in alternation over ``--rounds`` rounds; the
  ratio is the median of the rounds' ratios, so a clock drift during the run moves both sides
  alike. Also against one dense torch matmul of the same FLOPs (``tokens * topk`` rows): the
  tensor cores' rate on this GPU, the prefill bound.
- **route pack**: every moe.route_pack variant at each of ``--pack-tokens`` (default 1, 16 and
  4096), per launch in a replayed graph of back-to-back launches.

Every variant's decode runs before any prefill. Seconds of tensor-core work push the GPU to its
power cap, and a decode measured right after runs slower: on an H200, 2 % to 8 % after 20 s of
bf16 matmuls.

Routes, activations and weights are seeded by the problem, so every variant of a shape, in any
registry or order, sees the same routes and so the same padding; each variant gets the weights
in its ``w_layout`` (``w4a16_weights``), the same weights.

Registers, spills and shared memory of each variant come from the registry file (sqlite3).
Timings are medians of CUDA-event intervals (`_timing.device_ms`, which keeps the GPU busy
while the host launches, so no launch time is counted). Imports: the stdlib, torch,
b12x_aot.loader, b12x_aot.ops and the benchmarks' `_timing`.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from b12x_aot.loader import Registry
from b12x_aot.ops import w4a16_weights

from _timing import copy_gbps, device_ms, emit, graph_us

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def resources(path: str) -> dict[str, dict]:
    """Per variant key: registers, spill bytes, static/dynamic smem, from the registry file."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT c.key, k.registers, k.spill_store_bytes, k.static_smem_bytes, k.dynamic_smem_bytes "
            "FROM current_variants c JOIN variants v ON v.id = c.variant_id JOIN kernels k ON k.variant_id = v.id"
        ).fetchall()
    return {
        r[0]: {"registers": r[1], "spill_bytes": r[2], "static_smem": r[3], "dynamic_smem": r[4]}
        for r in rows
    }


def timed(fn, iters: int, before=None) -> float:
    """Median seconds of ``fn`` over ``iters`` CUDA-event intervals, after one warm-up call."""
    return device_ms(fn, reps=iters, warmup=1, before=before) / 1e3


def seeded(*problem: int) -> torch.Generator:
    """A generator seeded by the problem alone (ints hash the same in every process)."""
    return torch.Generator(device="cuda").manual_seed(hash(problem) & 0xFFFFFFFF)


def routes(tokens: int, topk: int, experts: int, gen: torch.Generator) -> torch.Tensor:
    """Each token picks ``topk`` distinct experts uniformly."""
    scores = torch.rand(tokens, experts, device="cuda", generator=gen)
    return scores.topk(min(topk, experts), dim=1).indices.to(torch.int32)


def working_ctas(ids: torch.Tensor, experts: int, p: dict) -> int:
    """CTAs of the launch that compute a tile: ``n / tile_n`` x ``k_ctas`` per block of a touched
    expert, less the blocks that ride along with the block before them (``tail_rows``)."""
    per_expert = torch.bincount(ids[(ids >= 0) & (ids < experts)])  # an untouched expert: 0 blocks
    bm, tail = p["block_m"], p.get("tail_rows", 0)
    blocks = (per_expert + bm - 1) // bm
    if tail:
        blocks -= ((blocks > 1) & (per_expert - (blocks - 1) * bm <= tail)).to(blocks.dtype)
    return int(blocks.sum()) * (p["n"] // p["tile_n"]) * p.get("k_ctas", 1)


def dequantized(w: torch.Tensor, s: torch.Tensor, group: int) -> torch.Tensor:
    lo, hi = (w & 0xF).to(torch.int8), (w >> 4).to(torch.int8)
    q = torch.stack((lo, hi), dim=-1).flatten(-2)
    q = torch.where(q >= 8, q - 16, q).float()
    return (q * s.float().repeat_interleave(group, dim=-1)).to(s.dtype)


@dataclass(frozen=True)
class Setup:
    """One variant ready to time: its launch and output, and the inputs it reads."""

    launch: Callable[[], None]
    out: torch.Tensor
    x: torch.Tensor
    ids: torch.Tensor
    scales: torch.Tensor
    experts: int


class Bench:
    def __init__(self, registry: Registry, args: argparse.Namespace) -> None:
        self.registry, self.args = registry, args
        # Read (not write) 512 MiB before each timed GEMM: the L2 then holds clean lines only.
        self.flush = torch.ones(128 * 2**20, device="cuda", dtype=torch.float32)
        # Weights and torch's per-expert work depend on the problem, not the tiling; variants
        # come grouped by problem, so only the current problem's are kept (they are large).
        # problem -> (weights by w_layout, scales)
        self.weights: dict[tuple, tuple[dict[str, torch.Tensor], torch.Tensor]] = {}
        self.baselines: dict[tuple, dict] = {}
        self.packs: dict[tuple, object] = {}
        self.reads: dict[int, float] = {}
        self.dense: dict[tuple, float] = {}
        self.sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count

    def route_pack(self, entry, registry: Registry | None = None):
        """The prepared moe.route_pack variant of ``registry`` (default: the bench's) whose
        scratch layout matches the GEMM's params."""
        registry = registry or self.registry
        p = entry.params
        want = (id(registry), p["topk"], p["block_m"], p["e_cap"])
        if want not in self.packs:
            for e in registry.entries():
                q = e.params
                if (
                    e.family == "moe.route_pack"
                    and e.arch == entry.arch
                    and (q["topk"], q["block_m"], q["e_cap"]) == want[1:]
                ):
                    self.packs[want] = registry.kernel(e.family, e.abi, **q).prepare()
                    break
            else:
                raise SystemExit(f"no moe.route_pack variant for {p}")
        return self.packs[want]

    def weights_for(self, p: dict, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The problem's weights in the variant's ``w_layout`` (one random draw per problem, each
        layout made from it once) and its scales."""
        problem = (p["element"], experts, p["n"], p["k"], p["group"])
        if problem not in self.weights:
            self.weights.clear()  # before allocating the next problem's: they are large
            gen = seeded(experts, p["n"], p["k"], p["group"])
            w = torch.randint(
                0, 256, (experts, p["n"], p["k"] // 2), device="cuda", dtype=torch.uint8, generator=gen
            )
            s = (torch.rand(experts, p["n"], p["k"] // p["group"], device="cuda", generator=gen) + 0.5) / (
                8 * p["k"] ** 0.5
            )
            self.weights[problem] = ({"nk": w}, s.to(TORCH[p["element"]]))
        layouts, scales = self.weights[problem]
        layout = p.get("w_layout", "nk")
        if layout not in layouts:
            layouts[layout] = w4a16_weights(layouts["nk"], layout)
        return layouts[layout], scales

    def read_s(self, nbytes: int) -> float:
        """Seconds to read ``nbytes`` once from DRAM (``torch.sum``, L2 flushed before each)."""
        if nbytes not in self.reads:
            buf = torch.zeros(nbytes // 4, device="cuda", dtype=torch.float32)
            self.reads[nbytes] = timed(buf.sum, self.args.iters, before=self.flush.sum)
        return self.reads[nbytes]

    def setup(self, entry, tokens: int, registry: Registry | None = None) -> Setup:
        """The GEMM of ``entry`` (a variant of ``registry``, default the bench's) on the
        problem's seeded inputs for ``tokens`` tokens, route pack done and one checked launch
        run: every variant of a problem gets the same inputs."""
        registry = registry or self.registry
        p = entry.params
        gemm = registry.kernel(entry.family, entry.abi, **p).prepare()
        experts = min(self.args.experts, p["e_cap"])
        w, s = self.weights_for(p, experts)
        gen = seeded(tokens, p["topk"], experts, p["k"])
        x = torch.randn(tokens, p["k"], device="cuda", generator=gen).to(TORCH[p["element"]])
        ids = routes(tokens, p["topk"], experts, gen)
        shapes = gemm.shapes(num_tokens=tokens, num_experts=experts)
        scratch = torch.empty(shapes["scratch"], device="cuda", dtype=torch.int32)
        out = torch.empty(shapes["out"], device="cuda", dtype=TORCH[p["output"]])
        self.route_pack(entry, registry).checked(scratch, ids, tokens, experts)
        gemm.checked(out, x, w, s, scratch, tokens, experts)
        torch.cuda.synchronize()
        return Setup(lambda: gemm(out, x, w, s, scratch, tokens, experts), out, x, ids, s, experts)

    def run(self, entry, phase: str, tokens: int) -> dict:
        """Time the GEMM for ``tokens`` tokens (after one route pack); prefill also times torch.
        The route pack's own time is :func:`route_pack_table`'s."""
        p = dict(entry.params)
        iters, elem = self.args.iters, TORCH[p["element"]]
        case = self.setup(entry, tokens)
        launch, x, ids, s, experts = case.launch, case.x, case.ids, case.scales, case.experts
        touched = int(torch.unique(ids).numel())
        result = {"tokens": tokens, "experts_touched": touched}

        if phase == "prefill":
            problem = (p["element"], p["n"], p["k"], p["group"], p["topk"], experts, tokens)
            if problem not in self.baselines:
                self.baselines.clear()  # before building the next problem's: they are large
                rows = self.weights_for({**p, "w_layout": "nk"}, experts)[0]  # torch dequantizes rows
                self.baselines[problem] = self.torch_baseline(x, ids, rows, s, p)
            flops = 2 * tokens * p["topk"] * p["n"] * p["k"]
            mine = self.versus_torch(launch, self.baselines[problem])
            dense = self.dense_s(tokens * p["topk"], p["n"], p["k"], elem)
            return result | mine | {"flops": flops, "dense_s": dense, "of_dense": dense / mine["gemm_s"]}
        t_gemm = timed(launch, iters, before=self.flush.sum)
        weight_bytes = touched * p["n"] * (p["k"] // 2 + p["k"] // p["group"] * s.element_size())
        read = self.read_s(weight_bytes)
        return result | {
            "ctas_per_sm": working_ctas(ids, experts, p) / self.sms,
            "gemm_s": t_gemm,
            "weight_bytes": weight_bytes,
            "weight_bytes_per_s": weight_bytes / t_gemm,
            "read_s": read,
            "gemm_over_read": t_gemm / read,
        }

    def dense_s(self, m: int, n: int, k: int, dtype) -> float:
        """Seconds of one dense ``[m, k] x [k, n]`` torch matmul: the same FLOPs as the GEMM at
        the tensor cores' dense rate (the prefill bound)."""
        key = (m, n, k, dtype)
        if key not in self.dense:
            self.dense.clear()
            x = torch.randn(m, k, device="cuda").to(dtype)
            w = torch.randn(n, k, device="cuda").to(dtype)
            out = torch.empty(m, n, device="cuda", dtype=dtype)
            self.dense[key] = timed(lambda: torch.matmul(x, w.T, out=out), self.args.iters)
        return self.dense[key]

    def versus_torch(self, gemm, baseline: dict) -> dict:
        """The GEMM, torch eager and torch's graph replay, timed in turn for ``--rounds`` rounds."""
        iters = self.args.iters
        rounds = {"gemm_s": [], "torch_eager_s": [], "torch_graph_s": [], "ratio": []}
        for _ in range(self.args.rounds):
            mine = timed(gemm, iters, before=self.flush.sum)
            eager = timed(baseline["eager"], iters, before=self.flush.sum)
            graph = timed(baseline["graph"].replay, iters, before=self.flush.sum)
            for key, value in (("gemm_s", mine), ("torch_eager_s", eager), ("torch_graph_s", graph)):
                rounds[key].append(value)
            rounds["ratio"].append(min(eager, graph) / mine)
        median = {key: statistics.median(values) for key, values in rounds.items()}
        return {
            "gemm_s": median["gemm_s"],
            "torch_eager_s": median["torch_eager_s"],
            "torch_graph_s": median["torch_graph_s"],
            "speedup_vs_torch": median["ratio"],
            "rounds": rounds,
        }

    def torch_baseline(self, x, ids, w, s, p) -> dict:
        """Per-expert matmuls on pre-dequantized weights and pre-gathered rows: an eager loop and
        its CUDA graph."""
        flat = ids.reshape(-1).long()
        rows = torch.arange(flat.numel(), device="cuda") // p["topk"]
        work = []
        for e in torch.unique(flat).tolist():
            xe = x[rows[flat == e]].contiguous()
            work.append(
                (
                    xe,
                    dequantized(w[e], s[e], p["group"]),
                    torch.empty(xe.shape[0], p["n"], device="cuda", dtype=x.dtype),
                )
            )

        def loop() -> None:
            for xe, we, oe in work:
                torch.matmul(xe, we.T, out=oe)

        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            loop()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            loop()
        return {"eager": loop, "graph": graph}  # both keep ``work`` alive


def route_pack_table(registry: Registry, arch: str, args: argparse.Namespace) -> list[dict]:
    """Every moe.route_pack variant of ``arch``, timed at each of ``--pack-tokens``: device
    time per launch in a replayed graph of back-to-back launches (routes L2-resident, as right
    after the router)."""
    rows = []
    tokens_list = args.pack_tokens
    packs = [e for e in registry.entries() if e.family == "moe.route_pack" and e.arch == arch]
    print(f"moe.route_pack\n{'variant':34} " + " ".join(f"{t:>7}" for t in tokens_list) + "  (us)")
    for entry in sorted(packs, key=lambda e: sorted(e.params.items())):
        p = dict(entry.params)
        pack = registry.kernel(entry.family, entry.abi, **p).prepare()
        experts = min(args.experts, p["e_cap"])
        times = {}
        for tokens in tokens_list:
            ids = routes(tokens, p["topk"], experts, seeded(tokens, p["topk"], experts))
            scratch = torch.empty(pack.shapes(num_tokens=tokens)["scratch"], device="cuda", dtype=torch.int32)
            pack.checked(scratch, ids, tokens, experts)
            times[tokens] = graph_us(lambda: pack(scratch, ids, tokens, experts)) / 1e6  # noqa: B023
        rows.append({"params": p, "seconds": times})
        name = "topk{topk} m{block_m} e{e_cap} t{cta_threads} r{cta_routes}".format(**p)
        print(f"{name:34} " + " ".join(f"{times[t] * 1e6:>7.1f}" for t in tokens_list), flush=True)
    return rows


def problem_of(params) -> tuple:
    """What the data, routes and torch's work depend on (the rest is tiling), in the order that
    keeps each cached weight set and torch baseline in use longest: ``output`` changes neither."""
    return tuple(params[k] for k in ("element", "e_cap", "n", "k", "group", "topk", "output"))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def counts(text: str) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]``; ``""`` -> ``[]``."""
    return [positive(part) for part in text.split(",") if part.strip()]


def label(p: dict) -> str:
    """A variant's params in one table cell."""
    text = (
        "{element}>{output} n{n} k{k} g{group} m{block_m} {tile_n}x{tile_k}x{stages} t{cta_threads}".format(
            **p
        )
    )
    text += f" s{p['split_k']}" if p.get("split_k", 1) > 1 else ""
    text += f" c{p['k_ctas']}" if p.get("k_ctas", 1) > 1 else ""
    text += " bulk" if p.get("w_copy") == "bulk" else ""
    text += f" tail{p['tail_rows']}" if p.get("tail_rows", 0) else ""
    text += f" cw{p['copy_warps']}" if p.get("copy_warps", 0) else ""
    return text + (f" {p['w_layout']}" if p.get("w_layout", "nk") != "nk" else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registry", required=True, help="registry file (SQLite)")
    ap.add_argument("--json", dest="json_out", help="write every number here")
    ap.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="PARAM=VALUE",
        help="only variants with this param value",
    )
    ap.add_argument(
        "--experts", type=positive, default=256, help="resident experts (capped at each variant's e_cap)"
    )
    for flag, default, what in (
        ("--decode-tokens", [1, 4, 16], "decode"),
        ("--pack-tokens", [1, 16, 4096], "route pack"),
    ):
        ap.add_argument(
            flag,
            type=counts,
            default=default,
            metavar="N[,N...]",
            help=f"{what} token counts (comma-separated; empty: none)",
        )
    ap.add_argument("--prefill-tokens", type=int, default=4096, help="prefill tokens (0: no prefill)")
    ap.add_argument("--iters", type=positive, default=20, help="timed launches per measurement")
    ap.add_argument("--rounds", type=positive, default=3, help="prefill: alternating GEMM/torch rounds")
    args = ap.parse_args(argv)
    where = dict(item.split("=", 1) for item in args.where)

    registry = Registry.open(args.registry)
    arch = registry.arch(torch.cuda.current_device())
    res = resources(args.registry)
    entries = sorted(
        (
            e
            for e in registry.entries()
            if e.family == "moe.w4a16"
            and e.arch == arch
            and all(str(e.params.get(k)) == v for k, v in where.items())
        ),
        key=lambda e: (problem_of(e.params), sorted(e.params.items())),
    )
    if not entries:
        print(f"no moe.w4a16 variants for {arch} match {where}", file=sys.stderr)
        return 1
    copy_bw = copy_gbps(2 << 30) * 1e9  # bytes read + written per second
    bench = Bench(registry, args)
    results = [{"params": dict(e.params), **res.get(e.key, {}), "decode": {}} for e in entries]
    print(f"{arch}: copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write); {len(entries)} variants")
    # Every decode first: a decode right after a prefill runs on a GPU that the prefill's
    # tensor-core load has pushed into its power cap, at lower clocks.
    for tokens in args.decode_tokens:
        print(
            f"decode, {tokens} tokens\n{'variant':58} {'regs':>4} {'spill':>5} {'smem':>7} "
            f"{'CTA/SM':>6} {'dec us':>7} {'GB/s':>6} {'/copy':>5} {'/read':>5}"
        )
        for entry, r in zip(entries, results, strict=True):
            d = r["decode"][tokens] = bench.run(entry, "decode", tokens)
            d["ratio_to_copy"] = d["weight_bytes_per_s"] / copy_bw
            print(
                f"{label(r['params']):58} {r.get('registers', 0):>4} {r.get('spill_bytes', 0) or 0:>5} "
                f"{r.get('dynamic_smem', 0):>7} {d['ctas_per_sm']:>6.2f} {d['gemm_s'] * 1e6:>7.1f} "
                f"{d['weight_bytes_per_s'] / 1e9:>6.0f} {d['ratio_to_copy']:>5.2f} {d['gemm_over_read']:>5.2f}",
                flush=True,
            )
    if args.prefill_tokens:
        print(
            f"prefill, {args.prefill_tokens} tokens\n{'variant':58} {'pre ms':>7} "
            f"{'torch':>7} {'x':>5} {'TFLOP/s':>7} {'/dense':>6}"
        )
        for entry, r in zip(entries, results, strict=True):
            f = r["prefill"] = bench.run(entry, "prefill", args.prefill_tokens)
            torch_s = min(f["torch_eager_s"], f["torch_graph_s"])
            print(
                f"{label(r['params']):58} {f['gemm_s'] * 1e3:>7.3f} {torch_s * 1e3:>7.3f} "
                f"{f['speedup_vs_torch']:>5.2f} {f['flops'] / f['gemm_s'] / 1e12:>7.0f} {f['of_dense']:>6.2f}",
                flush=True,
            )
    packs = route_pack_table(registry, arch, args) if args.pack_tokens else []
    if args.json_out:
        emit(
            {"arch": arch, "copy_bytes_per_s": copy_bw, "variants": results, "route_pack": packs},
            args.json_out,
        )
    registry.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
