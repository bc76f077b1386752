"""``b12x::topk_sum(routed, weights, route_ids, num_experts, output_dtype) -> out``: the
weighted sum of each token's top-k routed rows (``moe.topk_sum``)."""

from __future__ import annotations

from typing import Any

import torch

from b12x_aot.loader import PreparedLaunch, Registry

from ._base import RegistryOp, dtype_name

__all__ = ["TopKSumOp", "register_topk_sum"]


class TopKSumOp(RegistryOp):
    """``topk_sum``: the weighted sum of each token's top-k routed rows."""

    family = "moe.topk_sum"
    CTA_PREFERENCE = (256, 128)
    # Four tokens per CTA where a token has one route: a thread then keeps four rows in flight
    # (the spec builds it for topk 1 only; without it, one token per CTA).
    TOKENS_PREFERENCE = (4, 1)

    def launch_for(
        self, element: torch.dtype, output: torch.dtype, topk: int, hidden: int, device: int
    ) -> PreparedLaunch:
        params = {
            "element": dtype_name(element, "routed"),
            "output": dtype_name(output, "output_dtype"),
            "topk": topk,
            "hidden": hidden,
        }
        key = (*params.values(), device)
        choices = [
            {**params, "cta_threads": c, "tokens_per_cta": t}
            for t in self.TOKENS_PREFERENCE
            for c in self.CTA_PREFERENCE
        ]
        return self._launch(key, device, choices)

    def preload(self, routed: torch.Tensor, output_dtype: torch.dtype) -> None:
        """Resolve and load the variant these inputs need (call before graph capture)."""
        _, topk, hidden = routed.shape
        self.launch_for(routed.dtype, output_dtype, topk, hidden, routed.device.index or 0)

    def _define(self) -> Any:
        state = self

        @torch.library.custom_op(f"{self.namespace}::topk_sum", mutates_args=())
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


def register_topk_sum(registry: Registry, *, abi: int = 1, namespace: str = "b12x") -> TopKSumOp:
    """Define ``{namespace}::topk_sum`` over ``registry``. Call once per namespace."""
    return TopKSumOp(registry, abi=abi, namespace=namespace)
