"""Reading a cubin's SM from its ELF header, for both CUDA ELF ABI versions ptxas emits."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from b12x_aot.compiler import ContractError, check_contract, inspect_cubin
from b12x_aot.compiler._arch import ARCHS
from b12x_aot.loader._index import RegistryIndex

_EI_OSABI, _EI_ABIVERSION, _E_FLAGS = 7, 8, 48  # byte offsets in an ELF64 header
_ELFOSABI_CUDA_V1, _ELFOSABI_CUDA_V2 = 0x33, 0x41


def _elf(abi: int, e_flags: int) -> bytes:
    """The smallest ELF64 cubin header inspect_cubin reads: no kernels, an empty .symtab."""
    names = b"\0.shstrtab\0.strtab\0.symtab\0"
    strtab, symtab = b"\0", bytes(24)
    body = names + strtab + symtab
    shoff = 64 + len(body)
    ident = (
        b"\x7fELF" + bytes([2, 1, 1, _ELFOSABI_CUDA_V2 if abi >= 8 else _ELFOSABI_CUDA_V1, abi]) + bytes(7)
    )
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, e_flags, 64, 56, 0, 64, 4, 1)
    section = "<IIQQQQIIQQ"
    sections = [
        struct.pack(section, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        struct.pack(section, 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0),  # .shstrtab
        struct.pack(section, 11, 3, 0, 0, 64 + len(names), 1, 0, 0, 1, 0),  # .strtab
        struct.pack(section, 19, 2, 0, 0, 64 + len(names) + 1, 24, 2, 1, 8, 24),  # .symtab
    ]
    return header + body + b"".join(sections)


def _as_abi7(cubin: bytes, sm: int) -> bytes:
    """``cubin`` with the header ptxas before 13.0 writes for sm_90a: ABI 7, the SM in bits 0-7
    and again (as the virtual SM) in bits 16-23, like its real e_flags 0x5a0d5a."""
    out = bytearray(cubin)
    out[_EI_OSABI], out[_EI_ABIVERSION] = _ELFOSABI_CUDA_V1, 7
    struct.pack_into("<I", out, _E_FLAGS, sm << 16 | 0x0D00 | sm)
    return bytes(out)


@pytest.mark.parametrize(
    ("abi", "e_flags", "sm"),
    [
        (7, 0x5A0D5A, 90),  # ptxas 12.9, sm_90a
        (8, 0x600640A, 100),  # ptxas 12.9, sm_100a
        (8, 0x600780A, 120),  # ptxas 12.9, sm_120a
        (8, 0x6005A04, 90),  # ptxas 13.x, sm_90a
        (8, 0x6007802, 120),  # ptxas 13.x, sm_120a
    ],
)
def test_sm_is_read_where_the_abi_version_puts_it(abi: int, e_flags: int, sm: int) -> None:
    assert inspect_cubin(_elf(abi, e_flags)).sm == sm


def test_an_unknown_abi_version_is_refused() -> None:
    with pytest.raises(ContractError, match=r"CUDA ELF ABI version 9 \(e_flags 0x6005a04\)"):
        inspect_cubin(_elf(9, 0x6005A04))


@pytest.mark.dsl
def test_real_cubins_rewritten_to_abi7_read_the_same(built_registry: Path) -> None:
    index = RegistryIndex(built_registry)
    for entry in index.entries.values():
        cubin = index.read_artifact(entry)
        original = inspect_cubin(cubin)
        assert cubin[_EI_ABIVERSION] == 8
        rewritten = inspect_cubin(_as_abi7(cubin, original.sm))
        assert rewritten.sm == original.sm == ARCHS[entry.arch].sm
        assert rewritten.kernels == original.kernels
        check_contract(rewritten, entry.symbol, entry.arch, entry.kernel_params, entry.static, entry.args)
