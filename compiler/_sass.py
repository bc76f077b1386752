"""SASS instruction histograms from nvdisasm (the optional ``[sass]`` extra).

Counts every instruction of each kernel by opcode (``LDG.E.128``) and groups them by class:
tensor-core MMA, shared/global/local memory, conversions, barriers. Static spill traffic is
the bytes of the local-memory stores and loads (``STL``/``LDL``). Without nvdisasm the
histogram is unknown, which callers record as such; it is never an error.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from b12x_aot.registry import SassHistogram

from .errors import ToolchainError

__all__ = ["CLASSES", "find_nvdisasm", "has_nvdisasm", "sass_histograms", "sass_refusal"]

# Modifiers are upper case, except the shape of a warpgroup MMA (HGMMA.64x128x16.F32.BF16).
_LINE = re.compile(
    r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:\{\s*)?(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+(?:x[0-9]+)*)*)"
)
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")

# Base opcode -> class. Anything else counts only by opcode.
CLASSES: dict[str, frozenset[str]] = {
    "mma": frozenset(
        {
            "HMMA",
            "IMMA",
            "DMMA",
            "BMMA",
            "HGMMA",
            "IGMMA",
            "QGMMA",
            "BGMMA",
            "OMMA",
            "QMMA",
            "UTCHMMA",
            "UTCIMMA",
            "UTCQMMA",
            "UTCOMMA",
            "UTCMMA",
        }
    ),
    "shared_load": frozenset({"LDS", "LDSM", "LDSU"}),
    "shared_store": frozenset({"STS", "STSM"}),
    "global_load": frozenset({"LDG", "LDGSTS", "LDGDEPBAR", "UBLKCP", "UTMALDG", "LD"}),
    "global_store": frozenset({"STG", "UTMASTG", "ST", "RED", "ATOMG", "REDG"}),
    "local": frozenset({"LDL", "STL"}),
    "convert": frozenset({"F2F", "F2I", "I2F", "F2FP", "I2FP", "F2IP", "FRND", "I2I", "I2IP"}),
    "barrier": frozenset({"BAR", "BSYNC", "WARPSYNC", "MEMBAR", "SYNCS", "DEPBAR", "ERRBAR", "CCTL"}),
}
_CLASS_OF = {op: cls for cls, ops in CLASSES.items() for op in ops}
_WIDTH = re.compile(r"\.(8|16|32|64|128|U8|S8|U16|S16)\b")


def _access_bytes(opcode: str) -> int:
    widths = {"8": 1, "U8": 1, "S8": 1, "16": 2, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}
    match = _WIDTH.search(opcode)
    return widths[match.group(1)] if match else 4


def _nvidia_roots() -> list[str]:
    try:
        import nvidia  # the namespace package the CUDA wheels install into
    except ImportError:
        return []
    return list(getattr(nvidia, "__path__", []))


@functools.cache
def find_nvdisasm() -> str | None:
    """nvdisasm from PATH, or from the ``nvidia-cuda-nvdisasm`` wheel."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    for root in _nvidia_roots():
        for candidate in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return str(candidate)
    return None


def has_nvdisasm() -> bool:
    """Whether this process finds nvdisasm: what each executor reports of its processes."""
    return find_nvdisasm() is not None


def sass_refusal(specs: Sequence[str], where: Sequence[str]) -> ToolchainError:
    """The refusal of a build whose ``specs`` have limits only SASS decides, raised whenever a
    process that may compile them (``where``: "this machine", "worker tcp://...") has no
    nvdisasm. Without it those variants would end ``transient`` or be served unjudged, so every
    executor refuses the same way before anything compiles."""
    return ToolchainError(
        f"nvdisasm not found on {', '.join(where)}, and the limits (max_spill_bytes, async_wgmma) "
        f"of {', '.join(specs)} need its SASS histogram to be decided. Install it where the "
        "variants compile: pip install nvidia-cuda-nvdisasm (or the [sass] extra); nothing was compiled"
    )


def sass_histograms(cubin: bytes, *, timeout: float = 120.0) -> dict[str, SassHistogram] | None:
    """Histogram per kernel symbol, or ``None`` when nvdisasm is unavailable or fails."""
    tool = find_nvdisasm()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            proc = subprocess.run(
                [tool, "-c", f.name], capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
    if proc.returncode != 0:
        return None
    counts: dict[str, Counter[str]] = {}
    current: Counter[str] | None = None
    for line in proc.stdout.splitlines():
        section = _SECTION.match(line)
        if section:
            current = counts.setdefault(section.group(1), Counter())
            continue
        match = _LINE.match(line)
        if match and current is not None:
            current[match.group(1)] += 1
    out: dict[str, SassHistogram] = {}
    for symbol, opcodes in counts.items():
        classes: Counter[str] = Counter()
        spill_store = spill_load = 0
        for opcode, n in opcodes.items():
            base = opcode.split(".", 1)[0]
            if base in _CLASS_OF:
                classes[_CLASS_OF[base]] += n
            if base == "STL":
                spill_store += n * _access_bytes(opcode)
            elif base == "LDL":
                spill_load += n * _access_bytes(opcode)
        out[symbol] = SassHistogram(
            dict(sorted(opcodes.items())), {c: classes.get(c, 0) for c in CLASSES}, spill_store, spill_load
        )
    return out
