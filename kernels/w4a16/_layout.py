"""Where ``moe.w4a16``'s copies put each piece and where its mainloops read it.

:class:`RingLayout` is the shared-memory side (a ring slot's interleaved activation words and
weight lane pieces), :class:`WeightOrder` the global side (a tile's 16-byte weight units in the
``w_layout`` byte order). The writer (:mod:`._copies`) and the readers (:mod:`._mma`,
:mod:`._wgmma`) take the same records, so they agree by construction. Plain arithmetic: the
same methods serve the traced kernel (their arguments may be traced values) and the CPU tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from b12x_aot.contract.w4a16_layout import ATOM_K, BAND

__all__ = ["RingLayout", "WeightOrder", "pass_splits_bands"]


def pass_splits_bands(rows: int) -> bool:
    """Whether a weight copy pass of ``rows`` rows (copying threads over ``tile_k / 32``)
    straddles 64-row bands: its offset from pass 0 would then depend on the thread's row."""
    return rows % BAND != 0 and BAND % max(rows, 1) != 0


@dataclass(frozen=True, slots=True)
class WeightOrder:
    """A tile's weight rows in global memory: ``k`` and the ``w_layout`` (``nk`` or ``n64k128``,
    see :mod:`b12x_aot.contract.w4a16_layout`)."""

    k: int
    w_layout: str

    def unit(self, row, chunk):
        """The 16-byte unit of the tile's weight row ``row`` at k-chunk ``chunk`` (32 k), from
        the tile's first unit (an n64k128 tile starts a band); a constant for constant
        arguments."""
        k32 = self.k // 32
        if self.w_layout != "n64k128":
            return row * k32 + chunk
        per_row = ATOM_K // 32
        return (
            (row // BAND) * BAND * k32
            + (chunk // per_row) * BAND * per_row
            + (row % BAND) * per_row
            + chunk % per_row
        )


@dataclass(frozen=True, slots=True)
class RingLayout:
    """A ring slot's layout: ``block_m`` activation rows (decode tiles interleave them) and
    ``tile_n`` packed weight rows of ``tile_k`` k's. ``swapped``: an n64k128 decode tile's
    (tokens are the B operand); ``bulk``: weights bulk-copied, atoms in their global order."""

    block_m: int
    tile_n: int
    tile_k: int
    swapped: bool = False
    bulk: bool = False

    def a_rows_at(self, slot, atom, g, per_unit: int = 1):
        """Where rows ``g`` and ``g + 8`` of m16 atom ``atom`` start in ring slot ``slot`` of the
        interleaved activation tile, in 16-byte units (or in ``1 / per_unit`` of them); their
        A-fragment units follow in the order :meth:`a_unit` gives."""
        units = self.tile_k // 4 * per_unit  # per (row g, row g + 8) pair
        return slot * (self.block_m * units // 2) + atom * (8 * units) + g * units

    @staticmethod
    def a_unit(k16, step, g):
        """Where A-fragment unit ``(k16, step)`` of rows ``g``, ``g + 8`` sits after
        :meth:`a_rows_at`, in 16-byte units: ``4 * k16 + (step ^ ((k16 & 2) | (g & 1)))``, with
        ``k16 = k // 16`` in the k-tile. Row pairs start on 128-byte boundaries (``tile_k / 4``
        units), so a unit's bank group is its offset mod 8. An ``ld.shared.v4`` is served eight
        lanes at a time, ``g`` in ``{2i, 2i + 1}`` by ``c`` in ``0..3``, reading ``k16 = 4j + c``:
        ``c & 1`` picks half of the eight bank groups and the XOR spreads ``c & 2`` and ``g & 1``
        over its four, so the eight lanes hit every bank once."""
        return 4 * k16 + (((k16 & 2) | (g & 1)) ^ step)

    def a_word(self, slot, r, q, s):
        """Where :meth:`~._copies.TileCopies.pair_rows` (``nk``), or through :meth:`a_lane_word`
        the ``n64k128`` copies, store step ``s`` of piece ``q`` of row ``r``, in 32-bit words:
        A-fragment unit ``(q // 2, s)`` of rows ``r % 8``, ``r % 8 + 8`` holds
        ``[g:0, g+8:0, g:1, g+8:1]`` (row, k-half ``q % 2``), one A fragment; on swapped tiles
        ``[g:0, g:1, g+8:0, g+8:1]``, the B fragments of token atoms 0 and 1, each a register
        pair as loaded (no moves before the MMA)."""
        g, atom, half = r % 8, (r % 16) // 8, q % 2
        within = atom * 2 + half if self.swapped else atom + half * 2
        return self.a_rows_at(slot, r // 16, g, per_unit=4) + within + self.a_unit(q // 2, s, g) * 4

    def a_lane_word(self, slot, r, q, lane: int):
        """Where the ``n64k128`` copies of :meth:`~._copies.TileCopies.issue` put word ``lane``
        of piece ``q`` of row ``r``, in 32-bit words. It holds k ``8q + 2 lane`` and ``+ 1``:
        lane ``lane``'s k-half ``q % 2`` of MMA step ``(q // 2) % 4`` in 64-wide chunk
        ``q // 8`` (k ``64j + 16s + 8e + 2c``), so it goes where :meth:`a_word` puts that lane's
        piece of that step."""
        return self.a_word(slot, r, (q // 8) * 8 + 2 * lane + q % 2, (q // 2) % 4)

    def w_lane_piece(self, slot, j: int, row, g, c):
        """Where lane ``c`` (lane % 4) finds its 8 bytes of weight row ``row`` (``row % 8 == g``)
        in 64-wide k-chunk ``j`` of ring slot ``slot``, in 8-byte units: bytes ``[8c, 8c + 8)``
        of the row's 32, in the 16-byte half that the weight copies swapped when ``row & 4``;
        or, bulk-copied, where the atom's row-major order puts them (64 bytes per row)."""
        qw = self.tile_k // 32
        if self.bulk:
            return slot * (self.tile_n * qw * 2) + row * (2 * qw) + j * 4 + c
        return (
            slot * (self.tile_n * qw * 2)
            + j * (self.tile_n * 4)
            + row * 4
            + ((c // 2) ^ (g // 4)) * 2
            + c % 2
        )
