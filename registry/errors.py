"""Errors raised by the registry. The CLI maps each class to an exit code."""

from __future__ import annotations

from b12x_aot.contract import B12xError

__all__ = [
    "BlobDirError",
    "BlobError",
    "ManifestUnsatisfied",
    "NoSuchVariant",
    "RegistryDamaged",
    "RegistryError",
    "RegistryNotFound",
    "RegistryUsageError",
    "SchemaMismatch",
]


class RegistryError(B12xError):
    """Base class of registry errors."""


class RegistryNotFound(RegistryError):
    """The registry does not exist, cannot be reached, or is not a b12x-aot registry."""

    exit_code = 2


class RegistryDamaged(RegistryError):
    """A registry whose database pages or rows are damaged: SQLite reports it malformed, or a
    current variant lost a row it needs. Rerunning never helps; the message says what does."""

    exit_code = 2


class RegistryUsageError(RegistryError):
    """A registry location or option the command cannot use as given (the user changes it)."""

    exit_code = 2


class BlobDirError(RegistryError):
    """A blob directory that does not belong to the registry it is used with."""

    exit_code = 2


class SchemaMismatch(RegistryError):
    """The registry's schema version is not the one this code writes."""

    exit_code = 2

    def __init__(self, registry: str, found: int, expected: int, *, migratable: bool = True) -> None:
        super().__init__(registry, found, expected)
        self.registry, self.found, self.expected = registry, found, expected
        self.migratable = migratable

    def format_message(self) -> str:
        if self.found > self.expected:
            return (
                f"registry {self.registry} has schema version {self.found}, newer than this "
                f"b12x-aot's {self.expected}. Upgrade b12x-aot; never write to it with older code."
            )
        if not self.migratable:
            # No chain of migrations starts at this version: advising migrate would loop.
            return (
                f"registry {self.registry} has schema version {self.found}; this b12x-aot uses "
                f"{self.expected} and has no migration from {self.found}. Rebuild it with "
                f"`b12x-compile specs/ --registry NEW` (a new file or database)."
            )
        return (
            f"registry {self.registry} has schema version {self.found}; this b12x-aot uses "
            f"{self.expected}. Run `b12x-registry migrate --registry {self.registry}` first."
        )


class BlobError(RegistryError):
    """An artifact's bytes are missing or do not match their sha256."""

    def __init__(self, sha256: str, problem: str) -> None:
        super().__init__(sha256, problem)
        self.sha256, self.problem = sha256, problem

    def format_message(self) -> str:
        return f"artifact {self.sha256[:16]}: {self.problem}"


class NoSuchVariant(RegistryError):
    """A key or key prefix matched no variant, or more than one."""

    exit_code = 2


class ManifestUnsatisfied(RegistryError):
    """Manifest entries that no variant in the registry satisfies (export and gc --keep).

    ``outcome`` says what the command left alone because of them ("nothing was written").
    """

    def __init__(self, missing: list[str], outcome: str = "nothing was written") -> None:
        super().__init__(missing, outcome)
        self.missing, self.outcome = missing, outcome

    def format_message(self) -> str:
        rows = "\n".join(f"- {m}" for m in self.missing)
        return f"{len(self.missing)} manifest requirement(s) matched nothing; {self.outcome}:\n{rows}"
