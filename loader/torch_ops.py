"""torch.library custom ops over registry kernels (import this module only if you use torch).

One op per family, each a functional op with a fake (meta) implementation, so it runs eagerly,
inside CUDA graphs and under ``torch.compile(fullgraph=True)``:

- ``b12x::topk_sum(routed, weights, route_ids, num_experts, output_dtype) -> out``
- ``b12x::mxfp8_quant(x, rounding) -> (q, scales)``
- ``b12x::moe_w4a16(a, w, scales, route_ids, num_experts, output_dtype) -> out``: route pack,
  then the int4 grouped GEMM, with the scratch between them sized by the spec's ``shapes()``;
  ``w`` in the op's ``w_layout`` (:func:`w4a16_weights` converts it once, at load).

Each op picks its variant from its inputs' dtypes and shapes, launches through
``checked()`` (so a wrong size is refused before anything runs), and raises the registry's
miss error, with the nearest variants and the build command, when no variant fits. Variants
are resolved on first use and cached: call ``preload(...)`` with example inputs before
capturing a graph, as for any registry kernel.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from b12x_aot.contract import DTYPES

from ._launch import PreparedLaunch
from ._registry import Registry
from .errors import LaunchArgumentError
from .w4a16_layout import ATOM_K, BAND, CHUNK_K, LANE_ORDER, WEIGHT_LAYOUTS

__all__ = [
    "MoeW4A16Op",
    "Mxfp8QuantOp",
    "TopKSumOp",
    "register_moe_w4a16",
    "register_mxfp8_quant",
    "register_topk_sum",
    "w4a16_weights",
]

_DTYPE_NAMES = {getattr(torch, DTYPES[n].torch_name): n for n in ("fp32", "fp16", "bf16")}


def _dtype_name(dtype: torch.dtype, what: str) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise LaunchArgumentError("torch op", what, "must be float32, float16 or bfloat16", dtype) from None


def _check_w_layout(where: str, w_layout: str) -> None:
    if w_layout not in WEIGHT_LAYOUTS:
        raise LaunchArgumentError(where, "w_layout", f"must be one of {WEIGHT_LAYOUTS}", repr(w_layout))


def w4a16_weights(w: torch.Tensor, w_layout: str) -> torch.Tensor:
    """``w[E, n, k // 2]`` (u8 rows of packed int4) in the byte order ``w_layout`` names (see
    :mod:`b12x_aot.loader.w4a16_layout`), same shape: ``nk`` returns ``w`` itself (made
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


class _RegistryOp:
    """What every op shares: a registry, resolved launches cached by their inputs' signature.

    Each thread keeps its own launches: a :class:`PreparedLaunch` packs its arguments into one
    buffer, so two threads sharing one could launch each other's. The variants are loaded once
    (the registry is shared), so a thread's first call makes no driver call and may run inside
    a graph capture once any thread has preloaded.
    """

    family = ""

    def __init__(self, registry: Registry, *, abi: int = 1, namespace: str = "b12x") -> None:
        self.registry = registry
        self.abi = abi
        self.namespace = namespace
        self._local = threading.local()
        self.op = self._define()

    def _define(self) -> Any:
        """Define the ``torch.library`` op (once per namespace)."""
        raise NotImplementedError

    def _launch(
        self, key: Hashable, device: int, choices: Sequence[Mapping[str, Any]], family: str | None = None
    ) -> PreparedLaunch:
        """The first of ``choices`` (full param sets, best first) that the registry holds; when
        it holds none, the miss of the first (with its nearest variants)."""
        launches: dict[Hashable, PreparedLaunch] = self._local.__dict__.setdefault("launches", {})
        launch = launches.get(key)
        if launch is not None:
            return launch
        family = family or self.family
        arch = self.registry.arch(device)
        held = next((p for p in choices if self.registry.holds(family, self.abi, arch=arch, **p)), choices[0])
        kernel = self.registry.kernel(family, self.abi, device=device, **held)
        launch = launches[key] = kernel.prepare(device=device)
        return launch


class TopKSumOp(_RegistryOp):
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
            "element": _dtype_name(element, "routed"),
            "output": _dtype_name(output, "output_dtype"),
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

    def __call__(
        self,
        routed: torch.Tensor,
        weights: torch.Tensor,
        route_ids: torch.Tensor,
        num_experts: int,
        output_dtype: torch.dtype,
    ) -> torch.Tensor:
        return self.op(routed, weights, route_ids, num_experts, output_dtype)


class Mxfp8QuantOp(_RegistryOp):
    """``mxfp8_quant``: E4M3 values of ``x[M, K]`` with one UE8M0 scale byte per 32 elements."""

    family = "quant.mxfp8"
    CTA_PREFERENCE = (256, 128)

    def launch_for(self, dtype: torch.dtype, k: int, rounding: str, device: int) -> PreparedLaunch:
        params = {"dtype": _dtype_name(dtype, "x"), "K": k, "rounding": rounding}
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


class MoeW4A16Op(_RegistryOp):
    """``moe_w4a16``: route packing, then the int4-weight grouped GEMM, as one op.

    ``a[M, k]`` activations, ``w[E, n, k // 2]`` packed int4 weights and ``scales[E, n, k //
    group]`` of the experts that can be resident (``E <= e_cap``), ``route_ids[M, topk]``;
    returns ``out[M, topk, n]``. ``w`` must be in the op's ``w_layout``: ``nk`` rows, or the
    ``n64k128`` atoms that :func:`w4a16_weights` makes (faster). Nothing in the
    tensors tells the two apart: weights in the other order give wrong results, not an error.
    The tile follows the batch: decode tiles (``block_m`` 16) for up to ``decode_tokens``
    tokens (on the long-k shapes split-k ones, four one-warp k-parts, 128 wide where all the
    launch's CTAs then fit on the SMs at once; below 3/4 of a 128-wide tile per SM, clusters
    of CTAs split each tile's k too: :attr:`DECODE_REGIMES`), prefill tiles above ``prefill_tokens`` (``prefill_tail``
    ones when many experts are expected to end on a short block: :meth:`riding`), mid
    tiles between, each the first the registry holds in :attr:`TILES` order. Tiles sum in different fp32 orders, so a token's
    output bits can differ between batch sizes that pick different tiles (every tile meets the
    same accuracy bar); for one batch size they are always the same. The route-pack scratch
    comes from the spec's ``shapes()`` and is allocated per call by torch's allocator.
    """

    family = "moe.w4a16"
    # (block_m, tile_n, tile_k, stages, cta_threads, split_k, k_ctas, w_copy, tail_rows,
    # copy_warps), best first, per regime; the spec builds the split-k tiles only for the long-k
    # shapes, where they help, and bulk weight copies only on n64k128 weights, so the first tile
    # the registry holds for a problem is its best. Bulk copies lead every decode regime (an
    # H200, against the cp.async twin: decode 1.19x on FC2 at 16 tokens, and the 128-wide bulk
    # tile beats FC1's two-part split-k tile 1.13x at 4 tokens, 1.14x at 16; tiny 1.10x on FC1
    # at 1 token, 1.15x on N 384 at 16; cluster4 1.02-1.04x). Four k-parts of one warp with
    # 2-stage rings, built with bulk copies only, lead cluster2 (in clusters of 2), tiny and
    # decode (64 wide) and resident (128 wide): on an H200 over the tiles these regimes took
    # before, N 256 1.03-1.13x and N 384 1.09-1.11x at 4-16 tokens, FC1 1.01-1.07x at 1-16
    # (three runs in one process); nk weights take the tiles after them.
    # prefill_tail leads with tiles whose CTAs take an expert's short last block along
    # (tail_rows 16): 1.08-1.20x on FC1 / FC2 when experts average 128 routes, but 0.94-0.96x
    # where no last block is that short (an H200, 4,096 / 1,024 and 2,048 tokens, topk 8). The
    # 256-wide one (built where n allows it) beats the 128-wide one at 4,096 tokens over 256
    # experts on n64k128 weights: FC1 1.05-1.07x, FC2 1.02-1.08x, N 256 1.02-1.06x (three runs;
    # on nk weights 0.93-0.99x, one run). Its copy-warp twin
    # (copy_warps 4: a copy warpgroup, the ring handed over on mbarriers; the same bits) leads:
    # over it FC2 1.00-1.11x, FC1 1.00-1.02x, N 256 0.99-1.02x (five runs). Every riding tile
    # rides as _RIDER says.
    _DECODE = tuple((16, 128, 128, 3, threads, 1, 1, "cp_async", 0, 0) for threads in (128, 256, 512))
    # Four k-parts of one warp, 2-stage rings, bulk copies (n64k128 weights, k 7168): 64 and
    # 128 wide
    _PARTS4 = (16, 64, 128, 2, 128, 4, 1, "bulk", 0, 0)
    _PARTS4_128 = (16, 128, 128, 2, 128, 4, 1, "bulk", 0, 0)
    _TINY = (
        _PARTS4,
        (16, 64, 128, 3, 256, 4, 1, "bulk", 0, 0),
        (16, 64, 128, 3, 256, 4, 1, "cp_async", 0, 0),
        *_DECODE,
    )
    _PREFILL = (
        (128, 128, 64, 4, 128, 1, 1, "cp_async", 0, 0),
        (128, 128, 64, 4, 256, 1, 1, "cp_async", 0, 0),
        (64, 128, 64, 4, 128, 1, 1, "cp_async", 0, 0),
        (64, 128, 64, 3, 128, 1, 1, "cp_async", 0, 0),
    )
    TILES: Mapping[str, Sequence[tuple[int, int, int, int, int, int, int, str, int, int]]] = {
        "cluster4": (
            (16, 64, 128, 3, 128, 2, 4, "bulk", 0, 0),
            (16, 64, 128, 3, 128, 2, 4, "cp_async", 0, 0),
            *_TINY,
        ),
        "cluster2": (
            (16, 64, 128, 2, 128, 4, 2, "bulk", 0, 0),
            (16, 64, 128, 3, 128, 2, 2, "cp_async", 0, 0),
            *_TINY,
        ),
        "tiny": _TINY,
        "resident": (_PARTS4_128, *_TINY),
        "decode": (
            _PARTS4,
            (16, 128, 128, 3, 128, 1, 1, "bulk", 0, 0),
            (16, 64, 128, 3, 128, 2, 1, "cp_async", 0, 0),
            *_DECODE,
        ),
        "mid": (
            (32, 128, 64, 3, 256, 1, 1, "cp_async", 0, 0),
            (64, 128, 64, 4, 128, 1, 1, "cp_async", 0, 0),
            (64, 128, 64, 3, 128, 1, 1, "cp_async", 0, 0),
            (64, 128, 128, 3, 128, 1, 1, "cp_async", 0, 0),
        ),
        "prefill": _PREFILL,
        "prefill_tail": (
            (128, 256, 64, 7, 256, 1, 1, "cp_async", 16, 4),
            (128, 256, 64, 7, 256, 1, 1, "cp_async", 16, 0),
            (128, 128, 64, 4, 128, 1, 1, "cp_async", 16, 0),
            *_PREFILL,
        ),
    }
    TILE_PARAMS = (
        "block_m",
        "tile_n",
        "tile_k",
        "stages",
        "cta_threads",
        "split_k",
        "k_ctas",
        "w_copy",
        "tail_rows",
        "copy_warps",
    )
    # prefill_tail's lead tile by param: the block_m and tail_rows that riding reads
    _RIDER: ClassVar[Mapping[str, Any]] = dict(zip(TILE_PARAMS, TILES["prefill_tail"][0], strict=True))
    PACK_THREADS, PACK_ROUTES = 512, 1024
    # Decode regimes by 128-wide tiles per SM (measured on an H200): ordered bands, each below
    # its bound, so a name may repeat (not a name -> bound map). Clusters of 4 CTAs per tile,
    # of 2, split-k tiles without clusters, then the decode tiles. Between 1.5 and 2, the
    # 128-wide four-part tile's CTAs (two per SM fit) are all resident at once, where the
    # 64-wide one's (twice as many, three per SM fit) are not.
    DECODE_REGIMES = (("cluster4", 0.25), ("cluster2", 0.75), ("tiny", 1.5), ("resident", 2.0), ("tiny", 3.0))
    # prefill_tail when at least this share of experts is expected to end on a block of at
    # most 16 routes (see riding): 0.42 at 128 routes per expert (1.10-1.15x), 0.34 at
    # 256 (1.04x), none at 32 or 64 (0.94-0.96x)
    TAIL_SHARE = 0.25

    def __init__(
        self,
        registry: Registry,
        *,
        abi: int = 1,
        namespace: str = "b12x",
        e_cap: int = 256,
        decode_tokens: int = 16,
        prefill_tokens: int = 256,
        w_layout: str = "nk",
    ) -> None:
        _check_w_layout("moe_w4a16", w_layout)
        self.e_cap, self.decode_tokens, self.prefill_tokens = e_cap, decode_tokens, prefill_tokens
        self.w_layout = w_layout
        self._sms: dict[int, int] = {}
        super().__init__(registry, abi=abi, namespace=namespace)

    def regime(self, tokens: int, *, topk: int, experts: int, n: int, device: int) -> str:
        """:meth:`decode_regime` for a decode batch (on this device's SMs); ``mid`` or
        ``prefill`` by tokens above, ``prefill_tail`` when experts are expected to end on short
        blocks often enough (:meth:`riding` at :attr:`TAIL_SHARE`)."""
        if tokens <= self.decode_tokens:
            if device not in self._sms:
                self._sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
            return self.decode_regime(tokens, topk, experts, n, sms=self._sms[device])
        if tokens <= self.prefill_tokens:
            return "mid"
        return "prefill_tail" if self.riding(tokens * topk, experts) >= self.TAIL_SHARE else "prefill"

    @classmethod
    def decode_regime(cls, tokens: int, topk: int, experts: int, n: int, *, sms: int) -> str:
        """The first of :attr:`DECODE_REGIMES` whose bound the launch's 128-wide tiles per SM
        (one per expert the batch is expected to touch: :func:`touched_experts`) are under,
        else ``decode``."""
        per_sm = touched_experts(tokens, topk, experts) * (n // 128) / sms
        return next((name for name, bound in cls.DECODE_REGIMES if per_sm < bound), "decode")

    @classmethod
    def riding(cls, routes: int, experts: int) -> float:
        """:func:`riding_share` for the ``block_m`` and ``tail_rows`` of ``prefill_tail``'s
        lead tile."""
        return riding_share(routes, experts, block_m=cls._RIDER["block_m"], tail_rows=cls._RIDER["tail_rows"])

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
            "element": _dtype_name(a.dtype, "a"),
            "output": _dtype_name(output_dtype, "output_dtype"),
            "topk": topk,
            "n": w.shape[1],
            "k": k,
            "group": k // scales.shape[2] if scales.shape[2] else 0,
            "e_cap": self.e_cap,
            "w_layout": self.w_layout,
        }
        regime = regime or self.regime(a.shape[0], topk=topk, experts=w.shape[0], n=w.shape[1], device=device)
        tiles = [{**fixed, **dict(zip(self.TILE_PARAMS, tile, strict=True))} for tile in self.TILES[regime]]
        gemm = self._launch((*fixed.values(), regime, device), device, tiles)
        block_m = gemm.entry.params["block_m"]
        pack_params = {
            "topk": topk,
            "block_m": block_m,
            "e_cap": self.e_cap,
            "cta_threads": self.PACK_THREADS,
            "cta_routes": self.PACK_ROUTES,
        }
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
            regimes = (*dict.fromkeys(name for name, _ in self.DECODE_REGIMES), "decode")
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

    def __call__(
        self,
        a: torch.Tensor,
        w: torch.Tensor,
        scales: torch.Tensor,
        route_ids: torch.Tensor,
        num_experts: int,
        output_dtype: torch.dtype,
    ) -> torch.Tensor:
        return self.op(a, w, scales, route_ids, num_experts, output_dtype)


def touched_experts(tokens: int, topk: int, experts: int) -> float:
    """The expected number of ``experts`` that ``tokens`` tokens route to, each to ``topk``
    distinct experts picked uniformly."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - min(topk, experts) / experts) ** tokens)


@functools.lru_cache(maxsize=256)  # the op asks once per prefill call, mostly for a few batch sizes
def riding_share(routes: int, experts: int, *, block_m: int, tail_rows: int) -> float:
    """The expected share of ``experts`` whose routes, of ``routes`` spread uniformly, end on a
    last block of 1 to ``tail_rows`` routes after at least one full block of ``block_m``: the
    blocks a ``tail_rows`` tile folds into the block before. A normal approximation of each
    expert's binomial count."""
    if routes <= 0 or experts <= 0:
        return 0.0
    p = 1.0 / experts
    mean, sd = routes * p, max(math.sqrt(routes * p * (1.0 - p)), 1e-9)

    def below(x: float) -> float:  # P(count <= x)
        return 0.5 * (1.0 + math.erf((x + 0.5 - mean) / (sd * math.sqrt(2.0))))

    top = int(mean + 8 * sd) // block_m + 1
    return sum(below(j * block_m + tail_rows) - below(j * block_m) for j in range(1, top + 1))


def register_topk_sum(registry: Registry, *, abi: int = 1, namespace: str = "b12x") -> TopKSumOp:
    """Define ``{namespace}::topk_sum`` over ``registry``. Call once per namespace."""
    return TopKSumOp(registry, abi=abi, namespace=namespace)


def register_mxfp8_quant(registry: Registry, *, abi: int = 1, namespace: str = "b12x") -> Mxfp8QuantOp:
    """Define ``{namespace}::mxfp8_quant`` over ``registry``. Call once per namespace."""
    return Mxfp8QuantOp(registry, abi=abi, namespace=namespace)


def register_moe_w4a16(
    registry: Registry, *, abi: int = 1, namespace: str = "b12x", **policy: Any
) -> MoeW4A16Op:
    """Define ``{namespace}::moe_w4a16`` over ``registry`` (``policy``: ``e_cap``,
    ``decode_tokens``, ``prefill_tokens``, ``w_layout``). Call once per namespace."""
    return MoeW4A16Op(registry, abi=abi, namespace=namespace, **policy)
