"""moe.topk_sum on a GPU: every variant, against exact and fp64 torch references."""

from __future__ import annotations

import pytest

from ..conftest import family_variants
from .reference import TORCH_DTYPES, fma_f32, same_bits

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

ROWS = (1, 3, 7, 64, 4096)
NUM_EXPERTS = 16
INVALID_IDS = (-1, NUM_EXPERTS, 2**30)


def make_inputs(m: int, params: dict, gen: torch.Generator, *, invalid_fraction: float = 0.25) -> dict:
    topk, hidden = params["topk"], params["hidden"]
    element = TORCH_DTYPES[params["element"]]
    routed = torch.randn(m, topk, hidden, device="cuda", generator=gen).to(element)
    weights = torch.rand(m, topk, device="cuda", generator=gen) * 2 - 0.5
    ids = torch.randint(0, NUM_EXPERTS, (m, topk), device="cuda", generator=gen, dtype=torch.int32)
    invalid = torch.rand(m, topk, device="cuda", generator=gen) < invalid_fraction
    bad = torch.tensor(INVALID_IDS, device="cuda", dtype=torch.int32)
    pick = torch.randint(0, len(INVALID_IDS), (m, topk), device="cuda", generator=gen)
    ids = torch.where(invalid, bad[pick], ids)
    # NaN and Inf behind invalid routes: they must not leak into the output.
    poison = torch.full_like(routed, float("nan"))
    poison[..., ::2] = float("inf")
    routed = torch.where(invalid[..., None], poison, routed)
    weights = torch.where(invalid, torch.full_like(weights, float("nan")), weights)
    return {"routed": routed, "weights": weights, "route_ids": ids}


def exact_reference(inputs: dict, params: dict) -> torch.Tensor:
    """The kernel's arithmetic exactly: fp32 fma per valid route in ascending k, rounded once."""
    routed, weights, ids = inputs["routed"], inputs["weights"], inputs["route_ids"]
    valid = (ids >= 0) & (ids < NUM_EXPERTS)
    acc = torch.zeros(routed.shape[0], routed.shape[2], device="cuda", dtype=torch.float32)
    for k in range(params["topk"]):
        x = torch.where(valid[:, k, None], routed[:, k].float(), torch.zeros_like(acc))
        w = torch.where(valid[:, k], weights[:, k], torch.zeros_like(weights[:, k]))
        acc = torch.where(valid[:, k, None], fma_f32(w[:, None].expand_as(x), x, acc), acc)
    return acc.to(TORCH_DTYPES[params["output"]])


def fp64_reference(inputs: dict) -> torch.Tensor:
    ids = inputs["route_ids"]
    valid = (ids >= 0) & (ids < NUM_EXPERTS)
    x = torch.where(valid[..., None], inputs["routed"].double(), 0.0)
    w = torch.where(valid, inputs["weights"].double(), 0.0)
    return (w[..., None] * x).sum(dim=1)


def launch(prepared, out: torch.Tensor, inputs: dict, m: int, *, checked: bool = True) -> None:
    call = prepared.checked if checked else prepared
    call(out, inputs["routed"], inputs["weights"], inputs["route_ids"], m, NUM_EXPERTS)


def test_every_variant_matches_references(gpu_registry, device_arch: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1234)
    entries = family_variants(gpu_registry, "moe.topk_sum", device_arch)
    for entry in entries:
        p = dict(entry.params)
        prepared = gpu_registry.kernel(entry.family, entry.abi, **p).prepare()
        for m in ROWS:
            inputs = make_inputs(m, p, gen)
            before = {k: v.clone() for k, v in inputs.items()}
            out = torch.full((m, p["hidden"]), float("nan"), device="cuda", dtype=TORCH_DTYPES[p["output"]])
            launch(prepared, out, inputs, m)
            torch.cuda.synchronize()
            where = f"{entry.params} m={m}"
            assert not torch.isnan(out).any(), f"unwritten or leaked NaN: {where}"
            assert same_bits(out, exact_reference(inputs, p)), f"not bit-exact: {where}"
            ref = fp64_reference(inputs)
            err = (out.double() - ref).abs().max().item()
            scale = ref.abs().max().item() or 1.0
            tol = {"fp32": 1e-6, "bf16": 2**-8, "fp16": 2**-11}[p["output"]]
            assert err <= tol * scale, f"fp64 error {err / scale:.2e} > {tol:.1e}: {where}"
            for name, value in inputs.items():
                assert same_bits(value, before[name]), f"input {name} changed: {where}"


def test_invalid_ids_contribute_exactly_nothing(gpu_registry, device_arch: str) -> None:
    entry = family_variants(gpu_registry, "moe.topk_sum", device_arch)[-1]
    p = dict(entry.params)
    prepared = gpu_registry.kernel(entry.family, entry.abi, **p).prepare()
    gen = torch.Generator(device="cuda").manual_seed(5)
    m = 64
    inputs = make_inputs(m, p, gen, invalid_fraction=1.0)  # every route invalid, every row NaN/Inf
    out = torch.full((m, p["hidden"]), float("nan"), device="cuda", dtype=TORCH_DTYPES[p["output"]])
    launch(prepared, out, inputs, m)
    torch.cuda.synchronize()
    assert same_bits(out, torch.zeros_like(out))
    assert set(inputs["route_ids"].unique().tolist()) <= set(INVALID_IDS)


def test_graph_replay_with_new_inputs_equals_eager(gpu_registry, device_arch: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(99)
    for entry in family_variants(gpu_registry, "moe.topk_sum", device_arch)[:6]:
        p = dict(entry.params)
        prepared = gpu_registry.kernel(entry.family, entry.abi, **p).prepare()
        m = 64
        static = make_inputs(m, p, gen)
        out = torch.full((m, p["hidden"]), float("nan"), device="cuda", dtype=TORCH_DTYPES[p["output"]])
        loads = gpu_registry.stats.loads
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            launch(prepared, out, static, m, checked=False)  # warm up on the capture stream
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            launch(prepared, out, static, m, checked=False)
        assert gpu_registry.stats.loads == loads  # nothing loaded during capture
        for _ in range(3):
            fresh = make_inputs(m, p, gen)
            for name, value in fresh.items():
                static[name].copy_(value)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            eager = torch.full_like(out, float("nan"))
            launch(prepared, eager, fresh, m)
            torch.cuda.synchronize()
            assert same_bits(out, eager), f"graph != eager: {entry.params}"
            assert same_bits(out, exact_reference(fresh, p))


def test_tokens_per_cta_matches_its_one_token_twin_and_writes_no_row_past_the_last(
    gpu_registry, device_arch: str
) -> None:
    """A CTA of several tokens computes each like a CTA of one (the same bits), and the last CTA,
    holding fewer tokens than it could, writes nothing past ``num_tokens``."""
    gen = torch.Generator(device="cuda").manual_seed(4)
    entries = family_variants(gpu_registry, "moe.topk_sum", device_arch)
    grouped = [e for e in entries if e.params["tokens_per_cta"] > 1]
    assert grouped, "the registry holds no moe.topk_sum variant of several tokens per CTA"
    for entry in grouped:
        p = dict(entry.params)
        tokens = p["tokens_per_cta"]
        wide = gpu_registry.kernel(entry.family, entry.abi, **p).prepare()
        one = gpu_registry.kernel(entry.family, entry.abi, **{**p, "tokens_per_cta": 1}).prepare()
        for m in (1, tokens + 1, 2 * tokens - 1, 3 * tokens):
            inputs = make_inputs(m, p, gen)
            guard = torch.full(
                (m + tokens, p["hidden"]), float("nan"), device="cuda", dtype=TORCH_DTYPES[p["output"]]
            )
            twin = torch.full((m, p["hidden"]), float("nan"), device="cuda", dtype=TORCH_DTYPES[p["output"]])
            launch(wide, guard[:m], inputs, m)
            launch(one, twin, inputs, m)
            torch.cuda.synchronize()
            where = f"{p} m={m}"
            assert same_bits(guard[:m], twin), f"not the one-token twin's bits: {where}"
            assert torch.isnan(guard[m:]).all(), f"wrote past num_tokens: {where}"
