"""The byte orders of ``moe.w4a16`` weights (its ``w_layout`` param), for the kernel that reads
them and the host code that lays them out (:func:`b12x_aot.loader.torch_ops.w4a16_weights`).

``w[E, n, k / 2]`` is u8, two signed int4 per byte, low nibble first, in one of two orders per
expert:

- ``nk``: row ``r`` is bytes ``[r * k / 2, (r + 1) * k / 2)``.
- ``n64k128``: the rows form bands of ``BAND`` (64) rows; a band holds its ``k / ATOM_K`` atoms
  in k order, and an atom holds the band's 64 rows x ``ATOM_K / 2`` (64) bytes, in row order.
  A CTA tile of whole bands then reads each band as one contiguous run (4 KiB per 128-wide
  k-tile) instead of 64-byte pieces of rows ``k / 2`` bytes apart. Needs ``n % 64 == 0`` and
  ``k % 128 == 0``.

Both hold the same bytes, so a variant gives the same bits in either order. Nothing in a
launch tells them apart (same shape, same dtype): weights in the other order give wrong
results, not an error.
"""

from __future__ import annotations

__all__ = ["ATOM_K", "BAND", "WEIGHT_LAYOUTS"]

WEIGHT_LAYOUTS = ("nk", "n64k128")
BAND, ATOM_K = 64, 128  # n64k128: rows of a band, k of an atom
