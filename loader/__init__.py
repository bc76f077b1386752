"""b12x-aot loader: open a registry, resolve and preload variants, launch them.

Imports only the stdlib, ``cuda.bindings`` and ``b12x_aot.contract`` (the records a variant
is made of: arguments, expressions, geometry, its identity and key, the error base
``B12xError``; import those from there); torch is touched only when the caller passes tensors
or has imported it. Never compiles: a missing variant is an error that says how to build it.

    from b12x_aot.loader import Registry

    registry = Registry.open("kernels.db")
    topk_sum = registry.kernel("moe.topk_sum", 1, element="bf16", output="bf16",
                               topk=8, hidden=7168, cta_threads=128,
                               tokens_per_cta=1).prepare()
    topk_sum(out, routed, weights, route_ids, num_tokens, num_experts)
"""

from ._cuda import check, current_device, ensure_init
from ._index import READABLE_SCHEMA, IndexEntry, blob_path, schema_version_of
from ._launch import PreparedLaunch
from ._registry import Kernel, LoadStats, Registry
from .errors import (
    CaptureError,
    CudaError,
    IntegrityError,
    LaunchArgumentError,
    LoaderError,
    ManifestError,
    RegistryClosedError,
    RegistryFormatError,
    RequirementError,
    VariantMissError,
)

__all__ = [
    "READABLE_SCHEMA",
    "Buffer",
    "CaptureError",
    "CudaError",
    "IndexEntry",
    "IntegrityError",
    "Kernel",
    "LaunchArgumentError",
    "LoadStats",
    "LoaderError",
    "Manifest",
    "ManifestError",
    "ParamRange",
    "PreparedLaunch",
    "Registry",
    "RegistryClosedError",
    "RegistryFormatError",
    "Requirement",
    "RequirementError",
    "TensorView",
    "UncheckedSizeWarning",
    "VariantMissError",
    "blob_path",
    "check",
    "current_device",
    "ensure_init",
    "rehearse",
    "schema_version_of",
]

# Loaded on first use: serving processes that never touch them skip their import.
_LAZY = {
    "Buffer": "_checks",
    "TensorView": "_tensors",
    "UncheckedSizeWarning": "_checks",
    "Manifest": "_manifest",
    "ParamRange": "_manifest",
    "Requirement": "_manifest",
    "rehearse": "_codegen",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)
