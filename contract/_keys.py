"""Variant identity: the key, the canonical JSON it hashes, the family rule and the label.

The key is the sha256 of canonical JSON (sorted keys, no whitespace, ASCII) of the variant's
family, ABI version, arch and compile-time params, plus the key schema version. Nothing else
goes in: no environment, paths, mtimes or device identity, so every GPU of one arch and every
rank resolves to the same artifact. Every other hash of structured data in the project (spec
contracts, toolchains) goes through the same canonical JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "KEY_SCHEMA_VERSION",
    "VariantId",
    "arch_of",
    "canonical_hash",
    "canonical_json",
    "canonical_params",
    "check_family",
    "params_text",
    "variant_key",
    "variant_label",
]

# Bump when the encoding below changes; every key changes with it.
KEY_SCHEMA_VERSION = 1

# Patterns, not compiled ones: re compiles (and caches) them on first use, not at import.
_ARCH = r"^sm_\d{2,3}[af]?$"
# One encoder, reused: json.dumps with non-default options builds a new one on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)
_FAMILY = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$"


def canonical_json(value: Any) -> str:
    """``value`` as canonical JSON: sorted keys, no whitespace, ASCII only."""
    return _CANONICAL.encode(value)


def canonical_hash(value: Any) -> str:
    """The hex sha256 of :func:`canonical_json` of ``value``."""
    import hashlib  # here, not at import: keeps `import b12x_aot.loader` within its budget

    return hashlib.sha256(_CANONICAL.encode(value).encode()).hexdigest()


def check_family(family: object) -> str:
    """Return ``family`` if it is a dotted lowercase family name; raise ``ValueError`` if not."""
    if not isinstance(family, str) or not re.match(_FAMILY, family):
        raise ValueError(f"family must be dotted lowercase like 'moe.topk_sum' (got {family!r})")
    return family


def canonical_params(params: Mapping[str, object]) -> dict[str, int | str | bool]:
    """Check that every param value is an int, str or bool and return a plain dict."""
    out: dict[str, int | str | bool] = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"param names must be identifiers (got {name!r})")
        if value.__class__ not in (int, str, bool) and not isinstance(value, int | str):
            raise TypeError(
                f"param {name!r} must be an int, str or bool (got {type(value).__name__} {value!r})"
            )
        out[name] = value
    return out


def variant_key(*, family: str, abi: int, arch: str, params: Mapping[str, object]) -> str:
    """Return the hex sha256 that identifies one compiled variant.

    Raises ``ValueError``/``TypeError`` for a malformed family, ABI, arch or param value, so a
    bad key can never be built silently.
    """
    check_family(family)
    if isinstance(abi, bool) or not isinstance(abi, int) or abi < 1:
        raise ValueError(f"abi must be a positive integer (got {abi!r})")
    if not isinstance(arch, str) or not re.match(_ARCH, arch):
        raise ValueError(f"arch must look like 'sm_90a' (got {arch!r})")
    payload = {
        "key_schema": KEY_SCHEMA_VERSION,
        "family": family,
        "abi": abi,
        "arch": arch,
        "params": canonical_params(params),
    }
    return canonical_hash(payload)


def params_text(params: Mapping[str, Any]) -> str:
    """``k=v,k=v`` in sorted name order: how every tool prints a variant's params."""
    return ",".join(f"{k}={v}" for k, v in sorted(params.items()))


def variant_label(family: str, params: Mapping[str, Any], arch: str) -> str:
    """How every tool names a variant: ``family[k=v,...]@arch``."""
    return f"{family}[{params_text(params)}]@{arch}"


class VariantId(NamedTuple):
    """Who a variant is: family, ABI, arch, compile-time params and the key they hash to.

    The one identity record that plans, compile jobs, outcomes, registry records and query rows
    carry. Build it with :meth:`of`, which computes (and so validates) the key.
    """

    family: str
    abi: int
    arch: str
    params: Mapping[str, Any]
    key: str

    @classmethod
    def of(cls, *, family: str, abi: int, arch: str, params: Mapping[str, Any]) -> VariantId:
        key = variant_key(family=family, abi=abi, arch=arch, params=params)
        return cls(family, abi, arch, dict(params), key)

    @property
    def label(self) -> str:
        return variant_label(self.family, self.params, self.arch)

    def to_json(self) -> dict[str, Any]:
        return {**self._asdict(), "params": dict(self.params)}


def arch_of(major: int, minor: int) -> str:
    """The arch-specific target a device of compute capability ``major.minor`` runs."""
    return f"sm_{major}{minor}a"
