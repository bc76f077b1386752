"""The shared window of one rank: where counters, the peer table, barrier flags and data live.

This module is the single home of the byte layout that the ``comm.allreduce`` kernels and the
runtime agree on. Every rank owns one window (device memory that its peers map), laid out as::

    0      u32  calls         calls completed on this rank; the kernel's last CTA advances it
    4      u32  arrive        CTAs of the current call that have finished (reset by the last)
    8      u64  timeout_ns    how long a barrier waits for a peer before giving up
    16     u64  error_ptr     device address of the host-mapped error record (ERROR_*)
    64     u64  peers[MAX_WORLD]
                              each rank's window base, as mapped in this process (zero past world)
    256    u32  flags[2][MAX_BLOCKS][MAX_WORLD]
                              flags[bar][block][src]: the generation rank src last signalled
                              at barrier bar for CTA index block (two barriers per call)
    12288  data[2][world + 1][slot_bytes]    at DATA_OFFSET: the flags' end, rounded up to a page
                              two parities (calls % 2) of world + 1 slots: pull uses slot 0
                              as staging and slot world as the reduced-shard area; push uses
                              slot s as the inbox from rank s and slot world as the gather area

Stdlib only: the runtime imports it on serving machines, and the kernel at trace time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = [
    "ARRIVE_OFFSET",
    "CALLS_OFFSET",
    "DATA_OFFSET",
    "ERROR_BYTES",
    "ERROR_PTR_OFFSET",
    "ERROR_TIMEOUT",
    "FLAGS_OFFSET",
    "MAX_BLOCKS",
    "MAX_WORLD",
    "PACK_BYTES",
    "PAGE_BYTES",
    "PEERS_OFFSET",
    "TIMEOUT_OFFSET",
    "WindowLayout",
    "flag_offset",
    "shard",
]

MAX_WORLD = 16
MAX_BLOCKS = 64
PACK_BYTES = 16  # the unit of partition: 8 bf16/fp16 elements, one 16-byte vector access

CALLS_OFFSET = 0
ARRIVE_OFFSET = 4
TIMEOUT_OFFSET = 8
ERROR_PTR_OFFSET = 16
PEERS_OFFSET = 64
FLAGS_OFFSET = 256  # past peers[MAX_WORLD] (64 + 16 * 8 = 192)
PAGE_BYTES = 4096
# Past FLAGS_OFFSET + 2 * MAX_BLOCKS * MAX_WORLD * 4 = 8448, page-aligned: 12288. The spec's
# ctrl shape writes this number out (tests/comm/test_layout_spec.py keeps the two in step).
DATA_OFFSET = -(-(FLAGS_OFFSET + 2 * MAX_BLOCKS * MAX_WORLD * 4) // PAGE_BYTES) * PAGE_BYTES

# The error record (16 host-mapped bytes): word 0 is 0 while healthy, else
# ERROR_TIMEOUT | barrier << 24 | missing rank << 16 | block; word 1 the generation waited for.
ERROR_BYTES = 16
ERROR_TIMEOUT = 0x8000_0000


def flag_offset(barrier: int, block: int, src: int) -> int:
    """Byte offset in a window of the flag that rank ``src`` sets for ``block`` at ``barrier``."""
    return FLAGS_OFFSET + ((barrier * MAX_BLOCKS + block) * MAX_WORLD + src) * 4


def shard(index: Any, total: Any, parts: Any, *, minimum: Callable[[Any, Any], Any] = min) -> tuple[Any, Any]:
    """``[start, end)`` of part ``index`` when ``total`` units are cut into ``parts`` contiguous
    parts whose lengths differ by at most one (the first ``total % parts`` are one longer).

    The kernel traces this very arithmetic over its integers, passing the DSL's ``min``."""
    base, rem = total // parts, total % parts
    return index * base + minimum(index, rem), (index + 1) * base + minimum(index + 1, rem)


class WindowLayout(NamedTuple):
    """The window of a communicator of ``world`` ranks whose slots hold ``slot_bytes`` each."""

    world: int
    slot_bytes: int

    @property
    def slots(self) -> int:
        return self.world + 1

    @property
    def data_bytes(self) -> int:
        return 2 * self.slots * self.slot_bytes

    @property
    def bytes(self) -> int:
        """Bytes the window needs before rounding to the allocation granularity."""
        return DATA_OFFSET + self.data_bytes

    def slot_offset(self, parity: int, slot: int) -> int:
        return DATA_OFFSET + (parity * self.slots + slot) * self.slot_bytes
