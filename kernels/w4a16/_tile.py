"""The output tile a ``moe.w4a16`` CTA computes, as its mainloops and epilogues take it: a
named tuple, so tracing sees plain values."""

from __future__ import annotations

from typing import Any, NamedTuple

from cutlass import Int32

__all__ = ["OutTile"]


class OutTile(NamedTuple):
    """The output tile one CTA computes: ``out`` as vectors, the route pack's scratch ``sc``,
    the scratch word of the block's first row (``rows``), the rows of that row list the CTA
    computes (``reach``, see :meth:`~b12x_aot.kernels.w4a16.W4A16.rows_reached`) and the n tile."""

    m_out: Any
    sc: Any
    rows: Int32
    reach: Int32
    nt: Int32
