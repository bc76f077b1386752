"""Errors raised by the loader. Each says what failed, the bad value, and what to do next.

Every class derives from :class:`LoaderError`, itself a :class:`~b12x_aot.contract.B12xError`.
A malformed expression or argument declaration in a registry's records raises the contract's
own :class:`~b12x_aot.contract.ExpressionError` or :class:`~b12x_aot.contract.ArgError`: catch
``B12xError`` to catch those with the loader's errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from b12x_aot.contract import B12xError, VariantId, params_text

__all__ = [
    "CaptureError",
    "CudaError",
    "IntegrityError",
    "LaunchArgumentError",
    "LoaderError",
    "ManifestError",
    "RegistryClosedError",
    "RegistryFormatError",
    "RequirementError",
    "VariantMissError",
]


class LoaderError(B12xError):
    """Base class of every error the loader raises."""


class ManifestError(LoaderError, ValueError):
    """A manifest that does not have the documented shape."""


class RegistryFormatError(LoaderError):
    """The registry file is missing, unreadable, or of a schema this loader does not read."""


class RegistryClosedError(LoaderError):
    """A load was asked of a registry after its ``close()``."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path

    def format_message(self) -> str:
        return (
            f"registry {self.path} is closed: its libraries are unloaded. Open it again with "
            "Registry.open(...), or close it only at exit."
        )


class IntegrityError(LoaderError):
    """An artifact's bytes do not hash to the sha256 the registry records for them."""

    def __init__(self, key: str, expected: str, actual: str) -> None:
        super().__init__(key, expected, actual)
        self.key, self.expected, self.actual = key, expected, actual

    def format_message(self) -> str:
        return (
            f"artifact of variant {self.key[:16]} is corrupt: sha256 {self.actual[:16]}… "
            f"(expected {self.expected[:16]}…). Run `b12x-registry verify` on the registry and "
            "rebuild the variant with b12x-compile."
        )


class CaptureError(LoaderError):
    """A load or a miss was attempted while the launch stream is capturing a CUDA graph."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what

    def format_message(self) -> str:
        return (
            f"{self.what} while the current stream is capturing a CUDA graph. Nothing was sent to "
            "the driver and the capture is intact. Preload every variant before capture: "
            "call Registry.kernel(...) / Kernel.prepare() (or Registry.preload) at startup."
        )


class CudaError(LoaderError):
    """A CUDA driver call returned an error."""

    def __init__(self, call: str, code: int, name: str, meaning: str) -> None:
        super().__init__(call, code, name, meaning)
        self.call, self.code, self.name, self.meaning = call, code, name, meaning

    def format_message(self) -> str:
        return f"{self.call} failed: {self.name} ({self.code}): {self.meaning}"


class LaunchArgumentError(LoaderError, ValueError):
    """An argument passed to a checked launch violates the variant's declared ABI."""

    def __init__(self, kernel: str, arg: str, problem: str, got: object) -> None:
        super().__init__(kernel, arg, problem, got)
        self.kernel, self.arg, self.problem, self.got = kernel, arg, problem, got

    def format_message(self) -> str:
        return f"{self.kernel}: argument {self.arg!r} {self.problem} (got {self.got})"


class Miss(NamedTuple):
    """One variant that a caller asked for and the registry does not hold."""

    variant: VariantId
    nearest: Sequence[Mapping[str, object]] = ()
    spec_path: str | None = None
    hint: str = ""

    def command(self, registry: str) -> str:
        v = self.variant
        where = " ".join(f"--where {k}={val}" for k, val in sorted(v.params.items()))
        spec = self.spec_path or "specs/"
        return f"b12x-compile {spec} --registry {registry} --arch {v.arch} {where}"

    def describe(self, registry: str) -> str:
        v = self.variant
        lines = [f"{v.family} abi={v.abi} {v.arch} [{params_text(v.params)}] (key {v.key[:16]})"]
        if self.hint:
            lines.append(f"  {self.hint}")
        if self.nearest:
            lines.append("  nearest variants in the registry:")
            lines.extend(f"    {params_text(near)}" for near in self.nearest)
        if self.spec_path:
            lines.append(f"  spec: {self.spec_path}")
        lines.append(f"  build it: {self.command(registry)}")
        return "\n".join(lines)


class VariantMissError(LoaderError, LookupError):
    """A requested variant is not in the registry. Names the nearest ones and the fix."""

    def __init__(self, registry: str, miss: Miss) -> None:
        super().__init__(registry, miss)
        self.registry, self.miss = registry, miss

    def format_message(self) -> str:
        return f"no such variant in {self.registry}: " + self.miss.describe(self.registry)


class RequirementError(LoaderError, LookupError):
    """Registry.require found variants missing; it lists every one of them at once."""

    def __init__(self, registry: str, misses: Sequence[Miss]) -> None:
        super().__init__(registry, tuple(misses))
        self.registry, self.misses = registry, tuple(misses)

    def format_message(self) -> str:
        body = "\n".join(f"- {m.describe(self.registry)}" for m in self.misses)
        return f"{len(self.misses)} required variant(s) missing from {self.registry}:\n{body}"
