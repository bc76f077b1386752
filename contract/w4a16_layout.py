"""The byte orders of ``moe.w4a16`` weights (its ``w_layout`` param), for the kernel that reads
them and the host code that lays them out (:func:`b12x_aot.ops.w4a16_weights`).

``w[E, n, k / 2]`` is u8, two signed int4 per byte, in one of two orders per expert:

- ``nk``: row ``r`` is bytes ``[r * k / 2, (r + 1) * k / 2)``, low nibble first (k, k + 1).
- ``n64k128``: the rows form bands of ``BAND`` (64) rows; a band holds its ``k / ATOM_K`` atoms
  in k order, and an atom holds the band's 64 rows x ``ATOM_K / 2`` (64) bytes, in row order.
  A CTA tile of whole bands then reads each band as one contiguous run (4 KiB per 128-wide
  k-tile) instead of 64-byte pieces of rows ``k / 2`` bytes apart. Inside each 32 bytes of a
  row (64 k), the nibbles are in *lane order* (:data:`LANE_ORDER`): bytes ``[8c, 8c + 8)`` hold
  the k's that MMA lane ``c`` (lane % 4) takes in the natural k order, k ``16s + 8e + 2c`` and
  ``+ 1`` for MMA step ``s`` and k-half ``e``. Word ``w`` of those 8 bytes holds steps ``2w``
  and ``2w + 1``; pair ``t = 2 (s % 2) + e`` sits at nibbles ``t`` (k) and ``t + 4`` (k + 1),
  so one shift brings a pair to the low bits of the word's halves: one 8-byte load and no byte
  permute per operand pair. Needs ``n % 64 == 0`` and ``k % 128 == 0``.

Both hold the same weights. Tiles of 32 or more rows give the same bits in either order; decode
tiles (``block_m == 16``) pair k's within their MMAs as each order makes cheapest, so their fp32
sums may differ in the last bits between the orders (both match the reference alike). Nothing
in a launch tells the orders apart (same shape, same dtype): weights in the other order give
wrong results, not an error.
"""

from __future__ import annotations

__all__ = ["ATOM_K", "BAND", "CHUNK_K", "LANE_ORDER", "WEIGHT_LAYOUTS"]

WEIGHT_LAYOUTS = ("nk", "n64k128")
BAND, ATOM_K = 64, 128  # n64k128: rows of a band, k of an atom
CHUNK_K = 64  # k of the 32 bytes of a row whose nibbles n64k128 puts in lane order


def _lane_nibble(k: int) -> int:
    """Where n64k128 puts the nibble of k (``0 <= k < CHUNK_K``) among its chunk's 64 nibbles
    (nibble ``i`` is byte ``i // 2``, low nibble first)."""
    s, e, c, high = k // 16, k % 16 // 8, k % 8 // 2, k % 2
    word, t = s // 2, 2 * (s % 2) + e
    return 16 * c + 8 * word + t + 4 * high


LANE_ORDER = tuple(_lane_nibble(k) for k in range(CHUNK_K))  # k -> nibble in the chunk
