"""The topk_sum op on a GPU: eager, in a CUDA graph and under ``torch.compile(fullgraph=True)``,
bit-identical to the exact reference; its variant choice, and the miss when none is held."""

from __future__ import annotations

import pytest

from b12x_aot.loader import VariantMissError

from ..conftest import family_variants
from ..kernels.reference import same_bits
from ..kernels.test_topk_sum_gpu import NUM_EXPERTS, exact_reference, make_inputs

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def test_topk_sum_op_eager_graph_and_compile(gpu_registry, device_arch) -> None:
    from b12x_aot.ops import register_topk_sum

    p = dict(family_variants(gpu_registry, "moe.topk_sum", device_arch)[-1].params)
    op = register_topk_sum(gpu_registry, namespace="b12x_test")
    element, output = DTYPES[p["element"]], DTYPES[p["output"]]
    op.preload(torch.empty(1, p["topk"], p["hidden"], device="cuda", dtype=element), output)
    gen = torch.Generator(device="cuda").manual_seed(21)
    m = 16
    inputs = make_inputs(m, p, gen)
    args = (inputs["routed"], inputs["weights"], inputs["route_ids"], NUM_EXPERTS, output)
    eager = op(*args)
    torch.cuda.synchronize()
    assert same_bits(eager, exact_reference(inputs, p))

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        op(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = op(*args)
    fresh = make_inputs(m, p, gen)
    for name in ("routed", "weights", "route_ids"):
        inputs[name].copy_(fresh[name])
    graph.replay()
    torch.cuda.synchronize()
    assert same_bits(captured, exact_reference(fresh, p))

    compiled = torch.compile(lambda r, w, i: op.op(r, w, i, NUM_EXPERTS, output) * 1, fullgraph=True)
    got = compiled(inputs["routed"], inputs["weights"], inputs["route_ids"])
    torch.cuda.synchronize()
    assert same_bits(got, exact_reference(inputs, p))


def test_topk_sum_op_takes_four_tokens_per_cta_where_a_token_has_one_route(gpu_registry, device_arch) -> None:
    from b12x_aot.ops import register_topk_sum

    op = register_topk_sum(gpu_registry, namespace="b12x_tokens")
    # topk 2 and 8 have no four-token variant: the op must fall back to one, not miss
    for topk, tokens in ((1, 4), (2, 1), (8, 1)):
        launch = op.launch_for(torch.bfloat16, torch.bfloat16, topk, 7168, torch.cuda.current_device())
        assert launch.entry.params["tokens_per_cta"] == tokens, f"topk {topk}: {launch.entry.params}"
    # none held: the miss is the first choice's, with the registry's nearest variants
    with pytest.raises(VariantMissError, match="tokens_per_cta=4") as miss:
        op.launch_for(torch.bfloat16, torch.bfloat16, 1, 1234, torch.cuda.current_device())
    assert miss.value.miss.nearest
