"""Manifests: the variants a deployment needs, as families, param sets or ranges, and archs.

A manifest is a mapping (parsed from YAML or JSON by the caller) of the form::

    variants:
      - family: moe.topk_sum
        abi: 1
        archs: [sm_90a]                  # optional: all archs (export) / the device's (require)
        params:
          element: bf16                  # one value
          output: [fp32, bf16]           # any of these values
          hidden: {min: 2048, max: 7168} # every built value in the range (export only)

``Registry.require`` and ``b12x-registry export`` read the same records.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from b12x_aot.contract import short_repr

from .errors import ManifestError

__all__ = ["Manifest", "ParamRange", "Requirement"]

Value = int | str | bool
_SCALARS = (int, str, bool)  # exact classes: manifests come from YAML or JSON


class ParamRange(NamedTuple):
    """An inclusive integer range of a param."""

    lo: int | None
    hi: int | None

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        return (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)

    def __str__(self) -> str:
        return f"{self.lo if self.lo is not None else ''}..{self.hi if self.hi is not None else ''}"


class Requirement(NamedTuple):
    """One manifest entry: a family at one ABI, over param values and ranges."""

    family: str
    abi: int
    archs: tuple[str, ...] | None
    params: tuple[tuple[str, tuple[Value, ...] | ParamRange], ...]

    @property
    def is_exact(self) -> bool:
        return not any(isinstance(m, ParamRange) for _, m in self.params)

    def combinations(self) -> Iterator[dict[str, Value]]:
        """Every exact param set this entry names. Ranges cannot be enumerated."""
        if not self.is_exact:
            ranged = [n for n, m in self.params if isinstance(m, ParamRange)]
            raise ManifestError(
                f"{self.family}: params {', '.join(ranged)} are ranges; only explicit values "
                "can be required (ranges are for export, which matches them against a registry)"
            )
        names = [n for n, _ in self.params]
        for values in itertools.product(*(m for _, m in self.params)):  # type: ignore[misc]
            yield dict(zip(names, values, strict=True))

    def matches(self, family: str, abi: int, arch: str, params: Mapping[str, Any]) -> bool:
        if family != self.family or abi != self.abi:
            return False
        if self.archs is not None and arch not in self.archs:
            return False
        return all(name in params and params[name] in match for name, match in self.params)

    def unknown_params(self, params_of: Iterable[tuple[str, int, Mapping[str, Any]]]) -> str:
        """Why nothing can match when a param this entry names is no param of its family's
        variants (``params_of``: each variant's family, ABI and params): which names are
        unknown and which the family has; empty when every name is known."""
        known: set[str] = set()
        for family, abi, params in params_of:
            if family == self.family and abi == self.abi:
                known.update(params)
        unknown = [name for name, _ in self.params if name not in known]
        if not known or not unknown:
            return ""
        return (
            f"{self.family} abi={self.abi} has no param {', '.join(map(repr, unknown))} "
            f"(its params: {', '.join(sorted(known))})"
        )

    def describe(self) -> str:
        parts = []
        for name, match in self.params:
            shown = str(match) if isinstance(match, ParamRange) else "|".join(map(_shown, match))
            parts.append(f"{name}={shown}")
        archs = ",".join(self.archs) if self.archs is not None else "any arch"
        return f"{self.family} abi={self.abi} [{archs}] " + " ".join(parts)


def _shown(value: Value) -> str:
    """A value as a manifest line shows it: a string of digits quoted, so ``topk: "8"`` (which
    matches no int param) does not read like ``topk: 8``."""
    return repr(value) if isinstance(value, str) and value.lstrip("-").isdigit() else str(value)


class Manifest(NamedTuple):
    requirements: tuple[Requirement, ...]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Manifest:
        """Parse a manifest mapping; raise :class:`ManifestError` naming the bad entry."""
        if not isinstance(data, Mapping) or not isinstance(data.get("variants"), Sequence):
            raise ManifestError("a manifest is a mapping with a 'variants' list")
        reqs = [_requirement(i, entry) for i, entry in enumerate(data["variants"])]
        if not reqs:
            raise ManifestError("the manifest's 'variants' list is empty")
        return cls(tuple(reqs))


def _requirement(index: int, entry: Any) -> Requirement:
    if entry.__class__ is not dict and not isinstance(entry, Mapping):
        raise ManifestError(f"variants[{index}]: must be a mapping (got {short_repr(entry)})")
    if not entry.keys() <= _KEYS:
        unknown = short_repr(sorted(map(str, set(entry) - _KEYS)))
        raise ManifestError(f"variants[{index}]: unknown keys {unknown}; allowed: family, abi, archs, params")
    family, abi = entry.get("family"), entry.get("abi")
    if family.__class__ is not str:
        raise ManifestError(f"variants[{index}].family: must be a string (got {short_repr(family)})")
    if abi.__class__ is not int:
        raise ManifestError(f"variants[{index}].abi: must be an integer (got {short_repr(abi)})")
    archs = entry.get("archs")
    if archs is not None:
        if isinstance(archs, str):
            archs = [archs]
        if archs.__class__ not in (list, tuple) or not archs or not all(isinstance(a, str) for a in archs):
            raise ManifestError(
                f"variants[{index}].archs: must be a non-empty list of arch names such as [sm_90a] "
                f"(got {short_repr(archs)}); leave it out to mean every arch"
            )
        archs = tuple(archs)
    params_in = entry.get("params") or {}
    if params_in.__class__ is not dict and not isinstance(params_in, Mapping):
        raise ManifestError(f"variants[{index}].params: must be a mapping (got {short_repr(params_in)})")
    params = tuple((str(name), _match(index, name, raw)) for name, raw in params_in.items())
    return Requirement(family, abi, archs, params)


_KEYS = frozenset({"family", "abi", "archs", "params"})


def _match(index: int, name: str, raw: Any) -> tuple[Value, ...] | ParamRange:
    if raw.__class__ in _SCALARS:  # the common case first: one exact value
        return (raw,)
    where = f"variants[{index}].params.{name}"
    if isinstance(raw, Mapping):
        if set(raw) - {"min", "max"} or not raw:
            raise ManifestError(f"{where}: a range is {{min: N, max: M}} (got {short_repr(dict(raw))})")
        lo, hi = raw.get("min"), raw.get("max")
        for bound in (lo, hi):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
                raise ManifestError(f"{where}: range bounds must be integers (got {short_repr(bound)})")
        return ParamRange(lo, hi)
    values = raw if raw.__class__ in (list, tuple) else [raw]
    if not values or not all(v.__class__ in _SCALARS for v in values):
        raise ManifestError(f"{where}: values must be ints, strings or bools (got {short_repr(raw)})")
    return tuple(values)
