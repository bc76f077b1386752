"""torch.library custom ops over registry kernels (import this module only if you use torch).

``register_topk_sum(registry)`` defines ``b12x::topk_sum``: a functional op with a fake
(meta) implementation, so it runs eagerly, inside CUDA graphs and under
``torch.compile(fullgraph=True)``. Variants are resolved from tensor properties on first use
and cached; preload them (``warmup``) before capturing a graph, as for any registry kernel.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch

from ._launch import PreparedLaunch
from ._registry import Registry
from .errors import VariantMissError

__all__ = ["TopKSumOp", "register_topk_sum"]

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_CTA_PREFERENCE = (256, 128)


class TopKSumOp:
    """The ``topk_sum`` op bound to one registry; resolves and caches prepared launches."""

    def __init__(self, registry: Registry, *, abi: int = 1, namespace: str = "b12x") -> None:
        self.registry = registry
        self.abi = abi
        self.name = f"{namespace}::topk_sum"
        self._launches: dict[tuple[str, str, int, int, int], PreparedLaunch] = {}
        self._lock = threading.Lock()
        self.op = self._define()

    def launch_for(
        self, element: torch.dtype, output: torch.dtype, topk: int, hidden: int, device: int
    ) -> PreparedLaunch:
        key = (_DTYPE_NAMES[element], _DTYPE_NAMES[output], topk, hidden, device)
        launch = self._launches.get(key)
        if launch is not None:
            return launch
        with self._lock:
            misses: list[VariantMissError] = []
            for cta in _CTA_PREFERENCE:
                try:
                    kernel = self.registry.kernel(
                        "moe.topk_sum",
                        self.abi,
                        device=device,
                        element=key[0],
                        output=key[1],
                        topk=topk,
                        hidden=hidden,
                        cta_threads=cta,
                    )
                except VariantMissError as miss:
                    misses.append(miss)
                    continue
                launch = self._launches[key] = kernel.prepare(device=device)
                return launch
            raise misses[0]

    def warmup(self, shapes: Iterable[tuple[torch.dtype, torch.dtype, int, int]], device: int = 0) -> None:
        """Resolve and load ``(element, output, topk, hidden)`` combinations ahead of capture."""
        for element, output, topk, hidden in shapes:
            self.launch_for(element, output, topk, hidden, device)

    def _define(self) -> torch.library.CustomOpDef:
        state = self

        @torch.library.custom_op(self.name, mutates_args=())
        def topk_sum(
            routed: torch.Tensor,
            weights: torch.Tensor,
            route_ids: torch.Tensor,
            num_experts: int,
            output_dtype: torch.dtype,
        ) -> torch.Tensor:
            m, topk, hidden = routed.shape
            out = torch.empty((m, hidden), dtype=output_dtype, device=routed.device)
            launch = state.launch_for(routed.dtype, output_dtype, topk, hidden, routed.device.index or 0)
            launch.checked(out, routed, weights, route_ids, m, num_experts)
            return out

        @topk_sum.register_fake
        def _(routed, weights, route_ids, num_experts, output_dtype):  # type: ignore[no-untyped-def]
            torch._check(routed.dim() == 3, lambda: "routed must be [M, topk, hidden]")
            torch._check(weights.shape == routed.shape[:2], lambda: "weights must be [M, topk]")
            torch._check(route_ids.shape == routed.shape[:2], lambda: "route_ids must be [M, topk]")
            return routed.new_empty((routed.shape[0], routed.shape[2]), dtype=output_dtype)

        return topk_sum

    def __call__(
        self,
        routed: torch.Tensor,
        weights: torch.Tensor,
        route_ids: torch.Tensor,
        num_experts: int,
        output_dtype: torch.dtype,
    ) -> torch.Tensor:
        return self.op(routed, weights, route_ids, num_experts, output_dtype)


def register_topk_sum(registry: Registry, *, abi: int = 1, namespace: str = "b12x") -> TopKSumOp:
    """Define ``{namespace}::topk_sum`` over ``registry``. Call once per namespace."""
    return TopKSumOp(registry, abi=abi, namespace=namespace)
