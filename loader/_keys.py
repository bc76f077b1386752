"""The variant key: the one function that names a compiled variant.

The key is the sha256 of canonical JSON (sorted keys, no whitespace) of the variant's family,
ABI version, arch and compile-time params, plus the key schema version. Nothing else goes in:
no environment, paths, mtimes or device identity, so every GPU of one arch and every rank
resolves to the same artifact.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

__all__ = ["KEY_SCHEMA_VERSION", "arch_of", "canonical_params", "variant_key"]

# Bump when the encoding below changes; every key changes with it.
KEY_SCHEMA_VERSION = 1

_ARCH = re.compile(r"^sm_\d{2,3}[af]?$")
# One encoder, reused: json.dumps with non-default options builds a new one on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)
_FAMILY = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")


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
    if not _FAMILY.match(family):
        raise ValueError(f"family must be dotted lowercase like 'moe.topk_sum' (got {family!r})")
    if isinstance(abi, bool) or not isinstance(abi, int) or abi < 1:
        raise ValueError(f"abi must be a positive integer (got {abi!r})")
    if not _ARCH.match(arch):
        raise ValueError(f"arch must look like 'sm_90a' (got {arch!r})")
    payload = {
        "key_schema": KEY_SCHEMA_VERSION,
        "family": family,
        "abi": abi,
        "arch": arch,
        "params": canonical_params(params),
    }
    import hashlib  # here, not at import: keeps `import b12x_aot.loader` within its budget

    return hashlib.sha256(_CANONICAL.encode(payload).encode()).hexdigest()


def arch_of(major: int, minor: int) -> str:
    """The arch-specific target a device of compute capability ``major.minor`` runs."""
    return f"sm_{major}{minor}a"
