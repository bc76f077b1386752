"""Launch every single-GPU family on exact-size buffers with adversarial inputs, for
compute-sanitizer's memcheck (``tests/kernels/test_memcheck_gpu.py`` runs it under the tool).

Run with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so that every tensor is its own allocation of
exactly the bytes ``shapes()`` asks for: a read or write one element past an argument's extent
is then an access error, not a hit in a neighbour. Route ids include -1, num_experts, e_cap,
2**30 and -2**31. Each launch goes through ``checked()``. Exits non-zero if anything raises.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \\
        python -m tests.kernels.exact_size_launches REGISTRY

With ``--copy-warps`` only the ``moe.w4a16`` variants with a copy warpgroup run (racecheck of
their mbarrier ring, ``test_memcheck_gpu.py``: the tool is slow, the rest has no such ring).
"""

from __future__ import annotations

import sys

import torch

from b12x_aot.contract import DTYPES
from b12x_aot.loader import Registry

ADVERSARIAL = (-1, -(2**31), 2**30)


def tensors_for(launch, scalars: dict[str, int], gen: torch.Generator) -> list:
    """Exact-size inputs for the launch's pointer arguments, in spec order."""
    shapes = launch.shapes(**scalars)
    out = []
    for arg in launch.args:
        if not arg.is_pointer:
            out.append(scalars[arg.name])
            continue
        dtype = getattr(torch, DTYPES[arg.dtype].torch_name)
        shape = shapes[arg.name]
        if dtype.is_floating_point and dtype.itemsize > 1:
            t = torch.randn(shape, device="cuda", generator=gen).to(dtype)
        else:
            t = torch.randint(0, 256, shape, device="cuda", generator=gen, dtype=torch.int32).to(dtype)
        out.append(t)
    return out


def route_ids(m: int, topk: int, experts: int, e_cap: int, gen: torch.Generator) -> torch.Tensor:
    ids = torch.randint(0, max(experts, 1), (m, topk), device="cuda", generator=gen, dtype=torch.int32)
    bad = torch.tensor((*ADVERSARIAL, experts, e_cap), device="cuda", dtype=torch.int32)
    pick = torch.randint(0, bad.numel(), (m, topk), device="cuda", generator=gen)
    return torch.where(torch.rand(m, topk, device="cuda", generator=gen) < 0.3, bad[pick], ids)


def pick(registry: Registry, family: str, arch: str, **want) -> list:
    return [
        e
        for e in registry.entries()
        if e.family == family and e.arch == arch and all(e.params.get(k) == v for k, v in want.items())
    ]


def main(path: str, copy_warps_only: bool = False) -> None:
    torch.cuda.init()
    gen = torch.Generator(device="cuda").manual_seed(13)
    registry = Registry.open(path)
    arch = registry.arch(0)
    launched = 0
    if copy_warps_only:  # one variant per shape: racecheck takes about 30 s for each
        per_n = {e.params["n"]: e for e in pick(registry, "moe.w4a16", arch) if e.params.get("copy_warps")}
        if not per_n:
            registry.close()
            print("0 launches on exact-size buffers: no moe.w4a16 variant with copy warps")
            return
        _finish(registry, arch, _gemms(registry, arch, gen, list(per_n.values())))
        return
    # Four tokens per CTA too: 37 tokens leave the last CTA one, and no access past them.
    topk_sums = (
        pick(registry, "moe.topk_sum", arch, topk=8)[:4]
        + pick(registry, "moe.topk_sum", arch, tokens_per_cta=4)[:2]
    )
    for entry in topk_sums:
        launch = registry.kernel(entry.family, entry.abi, **entry.params).prepare()
        for m in (1, 37):
            args = tensors_for(launch, {"num_tokens": m, "num_experts": 16}, gen)
            args[3] = route_ids(m, entry.params["topk"], 16, 16, gen)
            launch.checked(*args)
            launched += 1
    for entry in pick(registry, "quant.mxfp8", arch)[:4]:
        launch = registry.kernel(entry.family, entry.abi, **entry.params).prepare()
        for m in (1, 33):
            launch.checked(*tensors_for(launch, {"num_rows": m}, gen))
            launched += 1
    gemms = pick(registry, "moe.w4a16", arch, n=2048, k=7168, element="bf16", output="bf16")
    clustered = [e for e in gemms if e.params.get("k_ctas", 1) > 1][:1]  # CTAs that share smem
    bulk = [e for e in gemms if e.params.get("w_copy") == "bulk"][:1]  # cp.async.bulk + mbarriers
    split = [e for e in gemms if e.params.get("copy_warps", 0)][:1]  # a copy warpgroup, mbarrier ring
    picked = [e for e in gemms if e.params["block_m"] in (16, 128)][:4]
    launched += _gemms(registry, arch, gen, picked + [e for e in clustered + bulk + split if e not in picked])
    _finish(registry, arch, launched)


def _gemms(registry: Registry, arch: str, gen: torch.Generator, entries: list) -> int:
    """Route pack + GEMM of each ``moe.w4a16`` entry at 3 and 300 tokens; the launches made."""
    launched = 0
    for entry in entries:
        p = entry.params
        gemm = registry.kernel(entry.family, entry.abi, **p).prepare()
        (pack_entry,) = pick(
            registry, "moe.route_pack", arch, topk=p["topk"], block_m=p["block_m"], e_cap=p["e_cap"]
        )
        pack = registry.kernel(pack_entry.family, pack_entry.abi, **pack_entry.params).prepare()
        for m, experts in ((3, 8), (300, 40)):
            scalars = {"num_tokens": m, "num_experts": experts}
            out, a, w, scales, scratch, *_ = tensors_for(gemm, scalars, gen)
            ids = route_ids(m, p["topk"], experts, p["e_cap"], gen)
            pack.checked(scratch, ids, m, experts)
            gemm.checked(out, a, w, scales, scratch, m, experts)
            launched += 2
    return launched


def _finish(registry: Registry, arch: str, launched: int) -> None:
    torch.cuda.synchronize()
    registry.close()
    print(f"{launched} launches on exact-size buffers, arch {arch}")
    if not launched:
        raise SystemExit("no variants of the families asked for in the registry")


if __name__ == "__main__":
    main(sys.argv[1], copy_warps_only="--copy-warps" in sys.argv[2:])
