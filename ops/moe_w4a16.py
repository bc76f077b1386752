"""``b12x::moe_w4a16(a, w, scales, route_ids, num_experts, output_dtype) -> out``: route pack,
then the int4 grouped GEMM (``moe.route_pack`` and ``moe.w4a16``), with the scratch between
them sized by the spec's ``shapes()``; ``w`` in the op's ``w_layout`` (:func:`w4a16_weights`
converts it once, at load). Which tile a batch takes: :mod:`.moe_w4a16_tiles`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from b12x_aot.contract.w4a16_layout import ATOM_K, BAND, CHUNK_K, LANE_ORDER, WEIGHT_LAYOUTS
from b12x_aot.loader import LaunchArgumentError, PreparedLaunch, Registry

from ._base import RegistryOp, dtype_name
from .moe_w4a16_tiles import W4A16Tiles, shipped_tiles

__all__ = ["MoeW4A16Op", "register_moe_w4a16", "w4a16_weights"]


def _check_w_layout(where: str, w_layout: str) -> None:
    if w_layout not in WEIGHT_LAYOUTS:
        raise LaunchArgumentError(where, "w_layout", f"must be one of {WEIGHT_LAYOUTS}", repr(w_layout))


def w4a16_weights(w: torch.Tensor, w_layout: str) -> torch.Tensor:
    """``w[E, n, k // 2]`` (u8 rows of packed int4) in the byte order ``w_layout`` names (see
    :mod:`b12x_aot.contract.w4a16_layout`), same shape: ``nk`` returns ``w`` itself (made
    contiguous), ``n64k128`` a new tensor. Convert once, when the weights are loaded."""
    what = f"{tuple(w.shape)} {w.dtype}"
    if w.dim() != 3 or w.dtype != torch.uint8:
        raise LaunchArgumentError("w4a16_weights", "w", "must be a [E, n, k // 2] uint8 tensor", what)
    _check_w_layout("w4a16_weights", w_layout)
    experts, n, half_k = w.shape
    if w_layout == "nk":
        return w.contiguous()
    row_bytes = ATOM_K // 2
    if n % BAND or half_k % row_bytes:
        raise LaunchArgumentError(
            "w4a16_weights",
            "w",
            f"needs n % {BAND} == 0 and k % {ATOM_K} == 0 for n64k128; keep w_layout='nk' for this shape",
            what,
        )
    # Nibbles of each 64-k chunk into lane order: nibble LANE_ORDER[k] is k's.
    nibbles = torch.stack((w & 0xF, w >> 4), dim=-1).reshape(experts, n, half_k * 2 // CHUNK_K, CHUNK_K)
    lanes = torch.empty_like(nibbles)
    lanes[..., list(LANE_ORDER)] = nibbles
    w = (lanes[..., 0::2] | (lanes[..., 1::2] << 4)).reshape(experts, n, half_k)
    atoms = w.reshape(experts, n // BAND, BAND, half_k // row_bytes, row_bytes).permute(0, 1, 3, 2, 4)
    return atoms.contiguous().view(experts, n, half_k)


class MoeW4A16Op(RegistryOp):
    """``moe_w4a16``: route packing, then the int4-weight grouped GEMM, as one op.

    ``a[M, k]`` activations, ``w[E, n, k // 2]`` packed int4 weights and ``scales[E, n, k //
    group]`` of the experts that can be resident (``E <= e_cap``), ``route_ids[M, topk]``;
    returns ``out[M, topk, n]``. ``w`` must be in the op's ``w_layout``: ``nk`` rows, or the
    ``n64k128`` atoms that :func:`w4a16_weights` makes (faster). Nothing in the
    tensors tells the two apart: weights in the other order give wrong results, not an error.
    The tile follows the batch (:meth:`regime`): ``tiles`` (the shipped table unless given)
    lists each regime's tiles best first, and the op takes the first the registry holds. Tiles
    sum in different fp32 orders, so a token's output bits can differ between batch sizes that
    pick different tiles (every tile meets the same accuracy bar); for one batch size they are
    always the same. The route-pack scratch comes from the spec's ``shapes()`` and is
    allocated per call by torch's allocator.
    """

    family = "moe.w4a16"

    def __init__(
        self,
        registry: Registry,
        *,
        abi: int = 1,
        namespace: str = "b12x",
        e_cap: int = 256,
        decode_tokens: int | None = None,
        prefill_tokens: int | None = None,
        w_layout: str = "nk",
        tiles: W4A16Tiles | None = None,
    ) -> None:
        _check_w_layout("moe_w4a16", w_layout)
        self.tiles = tiles or shipped_tiles()
        self.e_cap, self.w_layout = e_cap, w_layout
        self.decode_tokens = self.tiles.decode_tokens if decode_tokens is None else decode_tokens
        self.prefill_tokens = self.tiles.prefill_tokens if prefill_tokens is None else prefill_tokens
        self._sms: dict[int, int] = {}
        super().__init__(registry, abi=abi, namespace=namespace)

    def regime(self, tokens: int, *, topk: int, experts: int, n: int, device: int) -> str:
        """The table's decode regime for a decode batch (on this device's SMs); ``mid`` or
        ``prefill`` by tokens above, ``prefill_tail`` when experts are expected to end on short
        blocks often enough (:meth:`W4A16Tiles.riding` at its ``tail_share``)."""
        if tokens <= self.decode_tokens:
            if device not in self._sms:
                self._sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
            return self.tiles.decode_regime(tokens, topk, experts, n, sms=self._sms[device])
        if tokens <= self.prefill_tokens:
            return "mid"
        riding = self.tiles.riding(tokens * topk, experts)
        return "prefill_tail" if riding >= self.tiles.tail_share else "prefill"

    def launches_for(
        self,
        a: torch.Tensor,
        w: torch.Tensor,
        scales: torch.Tensor,
        topk: int,
        output_dtype: torch.dtype,
        regime: str | None = None,
    ) -> tuple[PreparedLaunch, PreparedLaunch]:
        """The (route pack, GEMM) pair for these inputs (in ``regime``, else the batch's)."""
        device = a.device.index or 0
        k = a.shape[1]
        fixed = {
            "element": dtype_name(a.dtype, "a"),
            "output": dtype_name(output_dtype, "output_dtype"),
            "topk": topk,
            "n": w.shape[1],
            "k": k,
            "group": k // scales.shape[2] if scales.shape[2] else 0,
            "e_cap": self.e_cap,
            "w_layout": self.w_layout,
        }
        regime = regime or self.regime(a.shape[0], topk=topk, experts=w.shape[0], n=w.shape[1], device=device)
        tiles = [{**fixed, **tile} for tile in self.tiles.choices(regime)]
        gemm = self._launch((*fixed.values(), regime, device), device, tiles)
        block_m = gemm.entry.params["block_m"]
        pack_params = {"topk": topk, "block_m": block_m, "e_cap": self.e_cap, **self.tiles.route_pack}
        pack = self._launch(("pack", *pack_params.values(), device), device, [pack_params], "moe.route_pack")
        return pack, gemm

    def preload(
        self, a: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, topk: int, output_dtype: torch.dtype
    ) -> None:
        """Resolve and load the variants these inputs need (call before graph capture). A
        decode-sized batch loads every decode regime's, a prefill-sized one both prefill
        regimes': any batch of the same kind can then be captured, whichever regime it falls in."""
        tokens = a.shape[0]
        regimes: Sequence[str | None] = (None,)
        if tokens <= self.decode_tokens:
            regimes = (*dict.fromkeys(name for name, _ in self.tiles.decode_bands), "decode")
        elif tokens > self.prefill_tokens:
            regimes = ("prefill", "prefill_tail")
        for regime in regimes:
            self.launches_for(a, w, scales, topk, output_dtype, regime)

    def _define(self) -> Any:
        state = self

        @torch.library.custom_op(f"{self.namespace}::moe_w4a16", mutates_args=())
        def moe_w4a16(
            a: torch.Tensor,
            w: torch.Tensor,
            scales: torch.Tensor,
            route_ids: torch.Tensor,
            num_experts: int,
            output_dtype: torch.dtype,
        ) -> torch.Tensor:
            m, topk = route_ids.shape
            pack, gemm = state.launches_for(a, w, scales, topk, output_dtype)
            words = pack.shapes(num_tokens=m, num_experts=num_experts)["scratch"]
            scratch = torch.empty(words, dtype=torch.int32, device=a.device)
            out = torch.empty((m, topk, w.shape[1]), dtype=output_dtype, device=a.device)
            pack.checked(scratch, route_ids, m, num_experts)
            gemm.checked(out, a, w, scales, scratch, m, num_experts)
            return out

        @moe_w4a16.register_fake
        def _(a, w, scales, route_ids, num_experts, output_dtype):  # type: ignore[no-untyped-def]
            torch._check(a.dim() == 2 and route_ids.dim() == 2, lambda: "a is [M, k], route_ids [M, topk]")
            torch._check(a.shape[0] == route_ids.shape[0], lambda: "a and route_ids disagree on M")
            torch._check(w.dim() == 3 and w.shape[2] * 2 == a.shape[1], lambda: "w must be [E, n, k // 2]")
            return a.new_empty((a.shape[0], route_ids.shape[1], w.shape[1]), dtype=output_dtype)

        return moe_w4a16


def register_moe_w4a16(
    registry: Registry, *, abi: int = 1, namespace: str = "b12x", **policy: Any
) -> MoeW4A16Op:
    """Define ``{namespace}::moe_w4a16`` over ``registry`` (``policy``: ``e_cap``,
    ``decode_tokens``, ``prefill_tokens``, ``w_layout``, ``tiles``). Call once per namespace."""
    return MoeW4A16Op(registry, abi=abi, namespace=namespace, **policy)
