"""A ``moe.w4a16`` variant's params, checked once, and the tile quantities they fix.

:class:`W4A16Params` holds the spec's params as the kernel's constructor gets them; building
one checks every rule the kernel needs (each message names the rule and the params it reads,
with their values), so the pieces that take a record never see a tile they cannot compute.
The derived quantities (a k-part's threads, the ring's rows, the copy passes, ...) are
properties: each has one definition here, whichever piece reads it. Plain Python, no DSL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from b12x_aot.contract import DTYPES, cdiv
from b12x_aot.contract.w4a16_layout import ATOM_K, BAND, WEIGHT_LAYOUTS

from ._layout import pass_splits_bands

__all__ = [
    "COPY_REGISTERS",
    "ELEMENTS",
    "OUTPUTS",
    "REGISTERS_PER_SM",
    "W4A16Params",
    "ring_bytes",
    "scale_row_bytes",
    "smem_bytes",
]

ELEMENTS = ("bf16", "fp16")  # activation dtypes: the dequant's operand formats
OUTPUTS = ("fp32", "bf16", "fp16")  # output dtypes: the fp32 sums rounded once

# With copy warps: the registers each copying thread keeps (its loop holds a few addresses and
# the activation rows' sources), and the SM's register file, which one CTA per SM shares out.
COPY_REGISTERS = 40
REGISTERS_PER_SM = 65536


def smem_bytes(params: Mapping[str, Any]) -> int:
    """Dynamic shared memory of a variant with these params; the spec's ``launch.smem`` must say
    the same: a ring per k-part (activation tiles of ``block_m + tail_rows`` rows), one scale
    slab, with ``w_copy == "bulk"`` an mbarrier (8 B) per ring slot, and with copy warps two
    (full and empty)."""
    split_k, stages = params["split_k"], params["stages"]
    ring = ring_bytes(
        block_m=params["block_m"] + params.get("tail_rows", 0),
        tile_n=params["tile_n"],
        tile_k=params["tile_k"],
        stages=stages,
    )
    mbarriers = 8 * split_k * stages if params["w_copy"] == "bulk" else 0
    if params.get("copy_warps", 0):
        mbarriers += 16 * stages  # full and empty per ring slot
    return split_k * ring + params["tile_n"] * scale_row_bytes(params["k"], params["group"], 2) + mbarriers


def ring_bytes(*, block_m: int, tile_n: int, tile_k: int, stages: int) -> int:
    """One k-part's cp.async ring: ``stages`` x (bf16/fp16 activation tile + packed int4 weights)."""
    return stages * (block_m * tile_k * 2 + tile_n * tile_k // 2)


def scale_row_bytes(k: int, group: int, size: int) -> int:
    """A scale row, padded by 16 B when needed so 8 consecutive rows hit 8 distinct bank groups."""
    row = k // group * size
    return row + (16 if row // 16 % 2 == 0 else 0)


@dataclass(frozen=True, slots=True)
class W4A16Params:
    """The params of one ``moe.w4a16`` variant (see the spec's ``params``).

    Raises ``ValueError`` naming every broken rule and the values it read. The record holds
    params only: the launch's block, cluster and shared memory are checked against it by the
    kernel (:meth:`~b12x_aot.kernels.w4a16.W4A16.__init__`)."""

    element: str
    output: str
    topk: int
    n: int
    k: int
    group: int
    block_m: int
    tile_n: int
    tile_k: int
    stages: int
    split_k: int
    cta_threads: int
    e_cap: int
    w_layout: str = "nk"
    k_ctas: int = 1
    w_copy: str = "cp_async"
    tail_rows: int = 0
    copy_warps: int = 0

    def __post_init__(self) -> None:
        choices = (
            ("element", ELEMENTS),
            ("output", OUTPUTS),
            ("w_layout", WEIGHT_LAYOUTS),
            ("w_copy", ("cp_async", "bulk")),
        )
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise ValueError(f"moe.w4a16: {name} must be one of {allowed} (got {getattr(self, name)!r})")
        for f in fields(self):
            value = getattr(self, f.name)
            least = 0 if f.name in ("tail_rows", "copy_warps") else 1
            if f.type == "int" and (type(value) is not int or value < least):
                raise ValueError(f"moe.w4a16: {f.name} must be an int >= {least} (got {value!r})")
        bad = [
            f"{rule} (got {', '.join(f'{name}={getattr(self, name)!r}' for name in names.split())})"
            for failed, rule, names in (*self._tile_rules(), *self._copy_rules())
            if failed
        ]
        if bad:
            raise ValueError("moe.w4a16 params break " + "; ".join(bad))

    def _tile_rules(self) -> list[tuple[Any, str, str]]:
        """``(broken, rule, the params it reads)`` for the tile's shape, its k-parts and CTAs."""
        split_k, k_ctas, tile_k, k = self.split_k, self.k_ctas, self.tile_k, self.k
        return [
            (
                not 1 <= split_k <= 15 or self.cta_threads % (32 * split_k) or (k // tile_k) % split_k,
                "1 <= split_k <= 15 (named barriers 1..15) divides the warps and the k-tiles",
                "split_k cta_threads k tile_k",
            ),
            (
                k_ctas not in (1, 2, 4, 8) or (k // tile_k) % (split_k * k_ctas),
                "k_ctas in (1, 2, 4, 8) and split_k * k_ctas divides the k-tiles",
                "k_ctas split_k k tile_k",
            ),
            (self.n % self.tile_n, "n % tile_n == 0", "n tile_n"),
            (k % tile_k or tile_k % 64, "tile_k % 64 == 0 and k % tile_k == 0", "k tile_k"),
            (
                self.cta_threads % 32
                or self.warp_cols % 8
                or self.warp_cols * self.part_warps != self.tile_n,
                "tile_n % (8 * part warps) == 0",
                "tile_n cta_threads split_k",
            ),
            (self.block_m % 16, "block_m % 16 == 0", "block_m"),
            (
                self.tail_rows % 16 or not 0 <= self.tail_rows < self.block_m,
                "tail_rows % 16 == 0 and 0 <= tail_rows < block_m",
                "tail_rows block_m",
            ),
            (
                self.swapped and self.warp_cols % 16,
                "n64k128 decode tiles (block_m 16): tile_n % (16 * part warps) == 0 (whole m16 atoms "
                "of weight rows per warp)",
                "w_layout block_m tile_n cta_threads split_k",
            ),
            # A 64-wide k-chunk's MMA steps take their scale where a group starts: at step
            # starts (group 16, 32) or chunk starts (multiples of 64), never inside a step.
            (
                (self.group % 64 and 64 % self.group) or self.group % 16 or (k // self.group) % 8,
                "group in (16, 32) or group % 64 == 0, and (k // group) % 8 == 0",
                "group k",
            ),
            (
                self.part_ktiles < self.stages or self.stages < 2,
                "2 <= stages <= k // tile_k // (split_k * k_ctas)",
                "stages k tile_k split_k k_ctas",
            ),
            # part 0 adds the other parts' sums from their rings' memory, KiB-aligned per part
            (
                (split_k + k_ctas - 2) * self.tile_n * self.block_m * 4 > split_k * self.part_ring_bytes,
                "the split_k and k_ctas sums fit the rings",
                "split_k k_ctas tile_n block_m tile_k stages tail_rows",
            ),
            (
                split_k > 1 and self.part_ring_bytes % 1024,
                "a k-part's ring is whole KiB",
                "split_k block_m tail_rows tile_n tile_k stages",
            ),
        ]

    def _copy_rules(self) -> list[tuple[Any, str, str]]:
        """``(broken, rule, the params it reads)`` for the copies: weight layouts, bulk copies,
        copying threads and copy warps."""
        copiers, qw = self.copiers, max(self.w_chunks, 1)
        return [
            (
                self.bulk and not (self.swapped and self.tile_k == ATOM_K),
                "w_copy in ('cp_async', 'bulk'); bulk: n64k128 decode tiles (block_m 16) with tile_k 128",
                "w_copy w_layout block_m tile_k",
            ),
            (
                self.atoms and (self.tile_n % BAND or self.k % ATOM_K or pass_splits_bands(copiers // qw)),
                "n64k128: tile_n % 64 == 0, k % 128 == 0, and (cta_threads / split_k) / "
                "(tile_k / 32) divides 64 or is a multiple of it (the rows one weight copy pass takes)",
                "w_layout tile_n k cta_threads split_k tile_k",
            ),
            (
                copiers % max(self.a_chunks, 1),
                "copying threads % (tile_k // 8) == 0",
                "cta_threads split_k copy_warps tile_k",
            ),
            (  # see TileCopies.issue_weights
                copiers // qw % 8,
                "copying threads // (tile_k // 32) % 8 == 0",
                "cta_threads split_k copy_warps tile_k",
            ),
            (
                self.copy_warps not in (0, 4)
                or (
                    self.copy_warps
                    and (self.split_k, self.k_ctas, self.block_m == 16, self.tile_k, self.cta_threads % 128)
                    != (1, 1, False, 64, 0)
                ),
                "copy_warps in (0, 4); 4: the wgmma loop's split_k == k_ctas == 1, block_m > 16, tile_k 64 "
                "and whole warpgroups",
                "copy_warps split_k k_ctas block_m tile_k cta_threads",
            ),
            (
                self.copy_warps and self.compute_registers <= self.launch_registers,
                "copy warps leave the compute threads more registers than the launch gives each thread",
                "copy_warps cta_threads",
            ),
        ]

    @property
    def part_threads(self) -> int:
        """Threads of one k-part: ``split_k`` parts of equal threads each walk ``k / split_k``
        of the tile (own ring, own named barrier); part 0 then adds the others' fp32 sums in
        part order and stores."""
        return self.cta_threads // max(self.split_k, 1)

    @property
    def part_warps(self) -> int:
        """Warps of one k-part."""
        return self.part_threads // 32

    @property
    def warp_cols(self) -> int:
        """Output columns (weight rows) per warp: warps split ``tile_n`` only."""
        return self.tile_n // max(self.part_warps, 1)

    @property
    def n8_atoms(self) -> int:
        """n8 MMA atoms per warp (``mma.sync``, not swapped)."""
        return self.warp_cols // 8

    @property
    def m16_atoms(self) -> int:
        """m16 MMA atoms of the block's rows (``mma.sync``, not swapped)."""
        return self.block_m // 16

    @property
    def weight_m16(self) -> int:
        """Swapped decode tiles: m16 atoms of weight rows per warp."""
        return self.warp_cols // 16

    @property
    def a_chunks(self) -> int:
        """16-byte chunks of an activation row of a k-tile."""
        return self.tile_k // 8

    @property
    def w_chunks(self) -> int:
        """16-byte chunks of a packed weight row of a k-tile."""
        return self.tile_k // 32

    @property
    def part_ktiles(self) -> int:
        """k-tiles of one k-part: ``k_ctas`` CTAs of a cluster split k further, each over
        ``k / k_ctas`` with its own parts; rank 0 then adds the other CTAs' sums in rank order
        (through its shared memory)."""
        return self.k // self.tile_k // max(self.split_k * self.k_ctas, 1)

    @property
    def ring_rows(self) -> int:
        """Activation rows a ring slot holds: an expert's last block of at most ``tail_rows``
        real rows rides with the block before it (wgmma tiles), whose CTAs take
        ``block_m + tail_rows`` rows."""
        return self.block_m + self.tail_rows

    @property
    def part_ring_bytes(self) -> int:
        """One k-part's ring (:func:`ring_bytes` of :attr:`ring_rows` rows)."""
        return ring_bytes(block_m=self.ring_rows, tile_n=self.tile_n, tile_k=self.tile_k, stages=self.stages)

    @property
    def copiers(self) -> int:
        """Threads that copy: a k-part's, or with ``copy_warps`` 4 (wgmma tiles) the warpgroup
        past the ``cta_threads`` compute threads that issues every copy."""
        return 32 * self.copy_warps if self.copy_warps else self.part_threads

    @property
    def block_threads(self) -> int:
        """The CTA's threads: the compute threads, then the copy warps."""
        return self.cta_threads + 32 * self.copy_warps

    @property
    def copy_passes(self) -> int:
        """Activation copy passes of a copying thread (rows it copies per k-tile)."""
        return cdiv(self.ring_rows, max(self.copiers // self.a_chunks, 1))

    @property
    def interleave(self) -> bool:
        """Decode blocks (``block_m`` 16) mostly hold one or two real rows: their few activation
        pieces can afford a pass through registers (``nk``: k, k + 4 pairs, the way the weight
        dequant takes them) or 4-byte copies (``n64k128``), each landing as register-move-free
        MMA fragments. Bigger blocks copy 16 bytes straight to shared memory."""
        return self.block_m == 16

    @property
    def atoms(self) -> bool:
        """``n64k128`` weights: 64-row atoms, nibbles in MMA lane order."""
        return self.w_layout == "n64k128"

    @property
    def lane_pieces(self) -> bool:
        """Whether each lane loads its own 8 bytes of a weight row per 64-wide k-chunk
        (:meth:`~._layout.RingLayout.w_lane_piece`): decode tiles' 16 contiguous k's, or the
        k's ``n64k128``'s lane order gathers there. Other tiles load 16-byte halves of ``nk``
        rows, broadcast to a lane quad, and pick bytes."""
        return self.interleave or self.atoms

    @property
    def fp32_scale(self) -> bool:
        """Decode blocks skip the packed multiply by the scale: a k-tile inside one group
        accumulates exact int4 products, then takes its scale once, in fp32, per output."""
        return self.block_m == 16 and self.group % self.tile_k == 0

    @property
    def swapped(self) -> bool:
        """Decode tiles on ``n64k128`` weights swap the MMA roles (weights A, tokens B; each
        warp holds whole m16 atoms of weight rows)."""
        return self.interleave and self.atoms

    @property
    def bulk(self) -> bool:
        """``w_copy`` bulk: weight k-tiles (one whole atom per 64-row band) arrive by one
        ``cp.async.bulk`` per band, issued by one thread, on the slot's mbarrier, instead of
        16-byte ``cp.async`` copies by every thread."""
        return self.w_copy == "bulk"

    @property
    def out_bytes(self) -> int:
        """Bytes of an output element."""
        return DTYPES[self.output].itemsize

    @property
    def out_vec(self) -> int:
        """Output elements per 16-byte vector."""
        return 16 // self.out_bytes

    @property
    def scale_chunks(self) -> int:
        """16-byte chunks of a scale row."""
        return self.k // self.group * 2 // 16

    @property
    def scale_row(self) -> int:
        """The shared scale slab's row stride, in elements (rows padded: :func:`scale_row_bytes`)."""
        return scale_row_bytes(self.k, self.group, 2) // 2

    @property
    def launch_registers(self) -> int:
        """Registers per thread at launch (one CTA per SM): the register file over the CTA's
        threads, in multiples of 8, at most 255."""
        return min(REGISTERS_PER_SM // self.block_threads, 255) // 8 * 8

    @property
    def compute_registers(self) -> int:
        """Registers per compute thread with copy warps: what the copy warpgroup leaves of the
        CTA's launch allocation, in setmaxnreg's multiples of 8, at most 256."""
        pool = self.launch_registers * self.block_threads
        share = (pool - 32 * self.copy_warps * COPY_REGISTERS) // self.cta_threads
        return min(share // 8 * 8, 256)

    @property
    def wgmma_fits(self) -> bool:
        """Whether the tile fits the sm_90a ``wgmma`` loop: a prefill tile (weights as the
        register A operand, 64 rows per warpgroup and m64 chunk, the block's activation rows
        as the shared-memory B operand) of 64-wide k-tiles and whole warpgroups, whose
        epilogue can stage the output tile, rows one 16-byte vector longer, in the ring."""
        threads, tn = self.part_threads, self.tile_n
        return (
            not self.interleave
            and self.split_k == 1
            and self.k_ctas == 1
            and self.tile_k == 64
            and self.stages >= 3
            and threads % 128 == 0
            and tn % 64 == 0
            and (tn // 64) % (threads // 128) == 0
            and self.ring_rows * (tn + self.out_vec) * self.out_bytes <= self.part_ring_bytes
        )
