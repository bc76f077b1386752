"""Read what a cubin says about itself, with no GPU: arch, kernels, parameters, resources.

Sources, all in the ELF: the header's ``e_flags`` (SM number, where its CUDA ELF ABI version puts
it), ``.symtab`` (kernel symbols), ``.nv.info`` (per-kernel register count, stack frame and stack
sizes), ``.nv.info.<kernel>`` (``EIATTR_KPARAM_INFO`` records, required threads, parameter bank
size), ``.nv.shared.<kernel>`` (static shared memory), ``.nv.constant0.<kernel>``,
``.text.<kernel>`` (code) and ``.note.nv.tkinfo`` (the ptxas version and flags that produced it;
ABI-7 cubins have none).
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from b12x_aot.registry import KernelResources, KParam

from .errors import ContractError

__all__ = ["CubinInfo", "inspect_cubin"]

# EIATTR attribute codes and record formats of the NVIDIA ELF ".nv.info" sections.
_FMT_SVAL = 0x04
_EIATTR_MAX_THREADS = 0x05
_EIATTR_REQNTID = 0x10
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MIN_STACK_SIZE = 0x12
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_CBANK_PARAM_SIZE = 0x19
_EIATTR_MAX_STACK_SIZE = 0x23
_EIATTR_REGCOUNT = 0x2F

# Where e_flags keeps the SM depends on the header's e_ident[EI_ABIVERSION]: CUDA ELF ABI 7 (ptxas
# 12.9 for sm_90a: e_flags 0x5a0d5a) has it in bits 0-7, ABI 8 (ptxas 13.x for every target: sm_90a
# gives 0x6005a04; ptxas 12.9 for sm_100a and sm_120a) in bits 8-15. Older ABIs are read like 7.
_LOW_BYTE_SM_ABI = 7
_SECOND_BYTE_SM_ABI = 8

_PTXAS_VERSION = re.compile(rb"Cuda compilation tools, release [\d.]+, V([\d.]+)")


@dataclass(frozen=True, slots=True)
class CubinInfo:
    sm: int
    ptxas_version: str | None
    ptxas_flags: str | None
    kernels: tuple[KernelResources, ...]

    def kernel(self, symbol: str) -> KernelResources:
        for k in self.kernels:
            if k.symbol == symbol:
                return k
        names = ", ".join(k.symbol for k in self.kernels) or "(none)"
        raise ContractError(f"cubin has no kernel {symbol!r}; kernels: {names}")


def _records(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """Split a .nv.info section into (format, attribute, payload-or-value) records."""
    out: list[tuple[int, int, bytes | int]] = []
    i = 0
    while i + 4 <= len(data):
        fmt, attr = data[i], data[i + 1]
        (value,) = struct.unpack_from("<H", data, i + 2)
        if fmt == _FMT_SVAL:
            out.append((fmt, attr, data[i + 4 : i + 4 + value]))
            i += 4 + value
        elif fmt in (1, 2, 3):
            out.append((fmt, attr, value))
            i += 4
        else:
            raise ContractError(f".nv.info record at byte {i} has unknown format {fmt:#x}")
    return out


def _sm(abi: int, e_flags: int) -> int:
    """The SM number from ``e_flags``, read as the header's CUDA ELF ABI version lays it out."""
    if abi <= _LOW_BYTE_SM_ABI:
        return e_flags & 0xFF
    if abi == _SECOND_BYTE_SM_ABI:
        return (e_flags >> 8) & 0xFF
    raise ContractError(
        f"cubin has CUDA ELF ABI version {abi} (e_flags {e_flags:#x}); b12x-aot reads the SM of "
        f"versions up to {_SECOND_BYTE_SM_ABI} only: extend b12x_aot.compiler._cubin._sm "
        "with that version's e_flags layout, or compile with a CuTe DSL whose ptxas emits one it knows"
    )


def _ptxas_note(elf: ELFFile) -> tuple[str | None, str | None]:
    section = elf.get_section_by_name(".note.nv.tkinfo")
    if section is None:
        return None, None
    raw = section.data()
    match = _PTXAS_VERSION.search(raw)
    version = match.group(1).decode() if match else None
    strings = [s.decode(errors="replace").strip() for s in raw.split(b"\0") if s.strip()]
    flags = next((s for s in reversed(strings) if s.startswith("-")), None)
    return version, flags


def inspect_cubin(data: bytes) -> CubinInfo:
    """Parse a cubin. Raises :class:`ContractError` if it is not a readable CUDA ELF."""
    try:
        elf = ELFFile(io.BytesIO(data))
        sm = _sm(elf.header["e_ident"]["EI_ABIVERSION"], elf.header["e_flags"])
        symtab = elf.get_section_by_name(".symtab")
        if symtab is None:
            raise ContractError("cubin has no .symtab")
        symbols = list(symtab.iter_symbols())
        # Kernels are the function symbols that own a ".text.<name>" section.
        entries = [(i, s.name) for i, s in enumerate(symbols) if s["st_info"]["type"] == "STT_FUNC"]
        per_symbol: dict[int, dict[int, int]] = {}
        info = elf.get_section_by_name(".nv.info")
        if info is not None:
            for fmt, attr, payload in _records(info.data()):
                if fmt == _FMT_SVAL and isinstance(payload, bytes) and len(payload) == 8:
                    index, value = struct.unpack("<II", payload)
                    per_symbol.setdefault(index, {})[attr] = value
        version, flags = _ptxas_note(elf)
        kernels = [_kernel(elf, name, per_symbol.get(index, {})) for index, name in entries]
    except ELFError as exc:
        raise ContractError(f"not a readable cubin: {exc}") from None
    return CubinInfo(sm, version, flags, tuple(k for k in kernels if k is not None))


def _kernel(elf: ELFFile, name: str, globals_: dict[int, int]) -> KernelResources | None:
    text = elf.get_section_by_name(f".text.{name}")
    if text is None:
        return None
    params: list[KParam] = []
    param_bytes = max_threads = None
    nv_info = elf.get_section_by_name(f".nv.info.{name}")
    if nv_info is not None:
        for _fmt, attr, payload in _records(nv_info.data()):
            if attr == _EIATTR_KPARAM_INFO and isinstance(payload, bytes) and len(payload) >= 12:
                _, ordinal, offset, bits = struct.unpack_from("<IHHI", payload)
                params.append(KParam(ordinal, offset, (bits >> 18) & 0x3FFF, bits & 0xFF))
            elif attr == _EIATTR_CBANK_PARAM_SIZE and isinstance(payload, int):
                param_bytes = payload
            elif attr in (_EIATTR_REQNTID, _EIATTR_MAX_THREADS) and isinstance(payload, bytes):
                x, y, z = struct.unpack_from("<III", payload)
                threads = x * y * z
                max_threads = threads if max_threads is None else min(max_threads, threads)
    shared = elf.get_section_by_name(f".nv.shared.{name}")
    const = elf.get_section_by_name(f".nv.constant0.{name}")
    code = text.data()
    return KernelResources(
        symbol=name,
        params=tuple(sorted(params, key=lambda p: p.ordinal)),
        param_bytes=param_bytes,
        registers=globals_.get(_EIATTR_REGCOUNT),
        frame_bytes=globals_.get(_EIATTR_FRAME_SIZE, 0),
        min_stack_bytes=globals_.get(_EIATTR_MIN_STACK_SIZE, 0),
        max_stack_bytes=globals_.get(_EIATTR_MAX_STACK_SIZE),
        static_smem_bytes=shared["sh_size"] if shared is not None else 0,
        const_bytes=const["sh_size"] if const is not None else 0,
        max_threads=max_threads,
        text_sha256=hashlib.sha256(code).hexdigest(),
        code_size=len(code),
    )
