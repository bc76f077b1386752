"""b12x-aot ops: torch.library custom ops over registry kernels (import this package only if you
use torch).

One op per family, each a functional op with a fake (meta) implementation, so it runs eagerly,
inside CUDA graphs and under ``torch.compile(fullgraph=True)``:

- ``b12x::topk_sum(routed, weights, route_ids, num_experts, output_dtype) -> out``
- ``b12x::mxfp8_quant(x, rounding) -> (q, scales)``
- ``b12x::moe_w4a16(a, w, scales, route_ids, num_experts, output_dtype) -> out``: route pack,
  then the int4 grouped GEMM; ``w`` in the op's ``w_layout`` (:func:`w4a16_weights` converts
  it once, at load). Its tile choice is a table beside it (:mod:`.moe_w4a16_tiles`).
- ``b12x::all_reduce(inp, handle) -> out`` over a :mod:`b12x_aot.comm` communicator.

Each registry op picks its variant from its inputs' dtypes and shapes, launches through
``checked()`` (so a wrong size is refused before anything runs), and raises the registry's
miss error, with the nearest variants and the build command, when no variant fits. Variants
are resolved on first use and cached: call ``preload(...)`` with example inputs before
capturing a graph, as for any registry kernel.

    from b12x_aot.loader import Registry
    from b12x_aot.ops import register_topk_sum

    topk_sum = register_topk_sum(Registry.open("kernels.db"))
    out = topk_sum(routed, weights, route_ids, num_experts, torch.bfloat16)

The family policy (which variant a batch takes) lives here, above the loader: the loader only
resolves, loads and launches what it is asked for.
"""

from .allreduce import AllReduceOp, register_all_reduce
from .moe_w4a16 import MoeW4A16Op, register_moe_w4a16, w4a16_weights
from .mxfp8_quant import Mxfp8QuantOp, register_mxfp8_quant
from .topk_sum import TopKSumOp, register_topk_sum

__all__ = [
    "AllReduceOp",
    "MoeW4A16Op",
    "Mxfp8QuantOp",
    "TopKSumOp",
    "register_all_reduce",
    "register_moe_w4a16",
    "register_mxfp8_quant",
    "register_topk_sum",
    "w4a16_weights",
]
