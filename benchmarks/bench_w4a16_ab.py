"""Two moe.w4a16 variants head to head: the same inputs, timed in alternation, bits compared.

    python benchmarks/bench_w4a16_ab.py --registry before.db [--versus after.db] \\
        --where n=2048 --where block_m=128 --where w_layout=n64k128 ... \\
        [--a stages=3] [--b stages=4] [--tokens 4096] [--rounds 12] [--json out.json]

Side A is the one variant of ``--registry`` that matches every ``--where`` and ``--a``; side B the
one of ``--versus`` (default: the same registry) that matches every ``--where`` and ``--b``.
Both must be of the same problem (dtypes, n, k, group, topk, e_cap); the weights come in each
side's ``w_layout``, the same weights. Each round times A then B, or B then A (alternately), each
as the median of ``--iters`` launches with L2 flushed before every one, so a clock drift or a
GPU warming up moves both sides alike. Reported: each side's median, the median of the rounds'
A / B time ratios (above 1: B is faster), and whether the two outputs are bit-identical.

This is how a change to a variant is measured: two passes of ``bench_w4a16.py``, one per
registry, can differ by several percent on the same cubins (each pass heats the GPU anew).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from bench_w4a16 import Bench, label, positive, timed

from b12x_aot.loader import Registry

from _timing import emit

PROBLEM = ("element", "output", "n", "k", "group", "topk", "e_cap")


def pick(registry: Registry, arch: str, where: dict[str, str], side: str):
    """The single moe.w4a16 entry of ``arch`` matching ``where``, or exit naming the matches."""
    found = [
        e
        for e in registry.entries()
        if e.family == "moe.w4a16"
        and e.arch == arch
        and all(str(e.params.get(k)) == v for k, v in where.items())
    ]
    if len(found) != 1:
        names = "; ".join(label(e.params) for e in found[:8]) or "none"
        raise SystemExit(
            f"side {side}: {len(found)} moe.w4a16 variants match {where} ({names}); narrow --where/--{side}"
        )
    return found[0]


def pairs(items: list[str]) -> dict[str, str]:
    try:
        return dict(item.split("=", 1) for item in items)
    except ValueError:
        raise SystemExit(f"expected PARAM=VALUE, got {items}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registry", required=True, help="side A's registry file (SQLite)")
    ap.add_argument("--versus", help="side B's registry file (default: --registry)")
    for flag, what in (("--where", "both sides"), ("--a", "side A only"), ("--b", "side B only")):
        ap.add_argument(flag, action="append", default=[], metavar="PARAM=VALUE", help=f"param value, {what}")
    ap.add_argument("--tokens", type=positive, default=4096, help="tokens (default 4096)")
    ap.add_argument(
        "--experts", type=positive, default=256, help="resident experts (capped at the variants' e_cap)"
    )
    ap.add_argument("--iters", type=positive, default=20, help="timed launches per measurement")
    ap.add_argument("--rounds", type=positive, default=12, help="alternating A/B rounds")
    ap.add_argument("--json", dest="json_out", help="write every number here")
    args = ap.parse_args(argv)
    common = pairs(args.where)

    reg_a = Registry.open(args.registry)
    reg_b = Registry.open(args.versus) if args.versus else reg_a
    arch = reg_a.arch(torch.cuda.current_device())
    a = pick(reg_a, arch, {**common, **pairs(args.a)}, "a")
    b = pick(reg_b, arch, {**common, **pairs(args.b)}, "b")
    if any(a.params[k] != b.params[k] for k in PROBLEM):
        raise SystemExit(f"the sides solve different problems: {label(a.params)} vs {label(b.params)}")

    # One bench: one weight draw for the problem (each w_layout made from it once), one flush.
    bench = Bench(reg_a, args)
    sides = [bench.setup(entry, args.tokens, registry) for registry, entry in ((reg_a, a), (reg_b, b))]
    same = torch.equal(sides[0].out.view(torch.uint8), sides[1].out.view(torch.uint8))

    times: tuple[list[float], list[float]] = ([], [])
    for r in range(args.rounds):
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            times[side].append(timed(sides[side].launch, args.iters, before=bench.flush.sum))
    ratio = statistics.median(ta / tb for ta, tb in zip(*times, strict=True))
    ms = [statistics.median(t) * 1e3 for t in times]
    print(f"{arch}, {args.tokens} tokens, {args.rounds} alternating rounds of {args.iters} launches")
    print(f"A {label(a.params):58} {ms[0]:8.3f} ms")
    print(f"B {label(b.params):58} {ms[1]:8.3f} ms")
    print(f"A / B {ratio:.3f} (above 1: B is faster); outputs {'bit-identical' if same else 'differ'}")
    if args.json_out:
        emit(
            {
                "arch": arch,
                "tokens": args.tokens,
                "a": {"params": dict(a.params), "ms": ms[0], "rounds_s": times[0]},
                "b": {"params": dict(b.params), "ms": ms[1], "rounds_s": times[1]},
                "a_over_b": ratio,
                "bit_identical": same,
            },
            args.json_out,
        )
    reg_a.close()
    if reg_b is not reg_a:
        reg_b.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
