"""The records a build hands the registry: provenance, kernel resources and outcomes.

The registry stores these; the compiler produces them (from package metadata, source files,
cubins and nvdisasm). They live here, beside the schema they fill, so the storage layer needs
nothing from the build layer. Structured values hash through the loader's one canonical JSON.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from b12x_aot.contract import VariantId, canonical_hash

__all__ = [
    "FailureRecord",
    "KParam",
    "KernelResources",
    "Provenance",
    "SassHistogram",
    "SourceClosure",
    "Toolchain",
    "VariantRecord",
]


@dataclass(frozen=True, slots=True)
class Toolchain:
    """The nvidia-cutlass-dsl* distributions compiles use, sorted, and the compile options.

    Of the DSL's per-CUDA builds (nvidia-cutlass-dsl-libs-cu12, -cu13: each its own ptxas) only
    the one the DSL loads on the building host is listed, so the hash tells them apart.
    """

    dsl: tuple[tuple[str, str], ...]  # (distribution, version)
    options: str

    @property
    def hash(self) -> str:
        return canonical_hash({"dsl": self.dsl, "options": self.options})

    def describe(self) -> str:
        return ", ".join(f"{n}=={v}" for n, v in self.dsl) + f" [{self.options}]"


@dataclass(frozen=True, slots=True)
class SourceClosure:
    """A kernel module and the project modules it imports: ``(module, sha256)``, sorted."""

    files: tuple[tuple[str, str], ...]

    @property
    def hash(self) -> str:
        h = hashlib.sha256()
        for module, digest in self.files:
            h.update(f"{module}\0{digest}\n".encode())
        return h.hexdigest()


@dataclass(frozen=True, slots=True)
class KParam:
    """One ``EIATTR_KPARAM_INFO`` record: where a kernel parameter sits in the param bank."""

    ordinal: int
    offset: int
    size: int
    log_align: int  # log2 of the pointee alignment the kernel assumes (0 for scalars)


@dataclass(frozen=True, slots=True)
class KernelResources:
    """What a cubin says about one of its kernels, read with no GPU."""

    symbol: str
    params: tuple[KParam, ...]
    param_bytes: int | None
    registers: int | None
    frame_bytes: int
    min_stack_bytes: int
    max_stack_bytes: int | None
    static_smem_bytes: int
    const_bytes: int
    max_threads: int | None
    text_sha256: str
    code_size: int


@dataclass(frozen=True, slots=True)
class SassHistogram:
    """A kernel's SASS instructions by opcode and by class, and its static spill traffic."""

    opcodes: dict[str, int]
    classes: dict[str, int]
    spill_store_bytes: int
    spill_load_bytes: int

    def count(self, prefix: str) -> int:
        """Instructions whose opcode starts with ``prefix`` (``"HGMMA"`` counts every shape)."""
        return sum(n for op, n in self.opcodes.items() if op.startswith(prefix))

    def to_json(self) -> dict[str, object]:
        """What the registry stores (spill bytes have columns of their own)."""
        return {"opcodes": self.opcodes, "classes": self.classes}


@dataclass(frozen=True, slots=True)
class Provenance:
    """What a variant was built from: source closure, spec contract and toolchain."""

    module: str
    source: SourceClosure
    spec_path: str
    spec_contract: Mapping[str, Any]
    toolchain: Toolchain

    @property
    def source_hash(self) -> str:
        return self.source.hash

    @property
    def spec_hash(self) -> str:
        return canonical_hash(self.spec_contract)

    @property
    def toolchain_hash(self) -> str:
        return self.toolchain.hash


@dataclass(frozen=True, slots=True)
class VariantRecord:
    """A compiled variant, ready to be recorded and made current."""

    variant: VariantId
    provenance: Provenance
    artifact: bytes
    args: tuple[Mapping[str, Any], ...]
    launch: Mapping[str, Any]
    dynamic_smem_bytes: int
    resources: KernelResources
    ptxas_version: str | None
    ptxas_flags: str | None
    sass: SassHistogram | None
    compile_seconds: float | None = None

    @property
    def artifact_sha256(self) -> str:
        return hashlib.sha256(self.artifact).hexdigest()


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """A variant a build could not produce (failed; timeout and transient, which the next build
    retries) or that its limits rejected."""

    variant: VariantId
    provenance: Provenance
    kind: str  # failed, timeout, transient, rejected
    stage: str
    reason: str
    log: str = ""
