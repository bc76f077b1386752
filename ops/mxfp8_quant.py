"""``b12x::mxfp8_quant(x, rounding) -> (q, scales)``: E4M3 values with one UE8M0 scale byte per
32 elements (``quant.mxfp8``)."""

from __future__ import annotations

from typing import Any

import torch

from b12x_aot.loader import PreparedLaunch, Registry

from ._base import RegistryOp, dtype_name

__all__ = ["Mxfp8QuantOp", "register_mxfp8_quant"]


class Mxfp8QuantOp(RegistryOp):
    """``mxfp8_quant``: E4M3 values of ``x[M, K]`` with one UE8M0 scale byte per 32 elements."""

    family = "quant.mxfp8"
    CTA_PREFERENCE = (256, 128)

    def launch_for(self, dtype: torch.dtype, k: int, rounding: str, device: int) -> PreparedLaunch:
        params = {"dtype": dtype_name(dtype, "x"), "K": k, "rounding": rounding}
        key = (*params.values(), device)
        return self._launch(key, device, [{**params, "cta_threads": c} for c in self.CTA_PREFERENCE])

    def preload(self, x: torch.Tensor, rounding: str) -> None:
        """Resolve and load the variant these inputs need (call before graph capture)."""
        self.launch_for(x.dtype, x.shape[-1], rounding, x.device.index or 0)

    def _define(self) -> Any:
        state = self

        @torch.library.custom_op(f"{self.namespace}::mxfp8_quant", mutates_args=())
        def mxfp8_quant(x: torch.Tensor, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
            m, k = x.shape
            q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
            scales = torch.empty((m, k // 32), dtype=torch.uint8, device=x.device)
            state.launch_for(x.dtype, k, rounding, x.device.index or 0).checked(q, scales, x, m)
            return q, scales

        @mxfp8_quant.register_fake
        def _(x, rounding):  # type: ignore[no-untyped-def]
            torch._check(x.dim() == 2, lambda: "x must be [M, K]")
            torch._check(x.shape[1] % 32 == 0, lambda: "K must be a multiple of 32")
            m, k = x.shape
            return x.new_empty((m, k), dtype=torch.float8_e4m3fn), x.new_empty(
                (m, k // 32), dtype=torch.uint8
            )

        return mxfp8_quant

    def __call__(self, x: torch.Tensor, rounding: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
        return self.op(x, rounding)


def register_mxfp8_quant(registry: Registry, *, abi: int = 1, namespace: str = "b12x") -> Mxfp8QuantOp:
    """Define ``{namespace}::mxfp8_quant`` over ``registry``. Call once per namespace."""
    return Mxfp8QuantOp(registry, abi=abi, namespace=namespace)
