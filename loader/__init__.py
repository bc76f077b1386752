"""b12x-aot loader: open a registry, resolve and preload variants, launch them.

Imports only the stdlib and ``cuda.bindings``; torch is touched only when the caller passes
tensors or has imported it. Never compiles: a missing variant is an error that says how to
build it.

    from b12x_aot.loader import Registry

    registry = Registry.open("kernels.db")
    topk_sum = registry.kernel("moe.topk_sum", 1, element="bf16", output="bf16",
                               topk=8, hidden=7168, cta_threads=128,
                               tokens_per_cta=1).prepare()
    topk_sum(out, routed, weights, route_ids, num_tokens, num_experts)
"""

from ._abi import DTYPES, SCALAR_KINDS, Arg, DType, ScalarKind, tensor_fields
from ._cuda import check, current_device, ensure_init
from ._expr import TRACED, Expr, cdiv, tdiv, tmod
from ._geometry import Geometry, StaticGeometry
from ._index import READABLE_SCHEMA, IndexEntry, blob_path, schema_version_of
from ._keys import (
    KEY_SCHEMA_VERSION,
    VariantId,
    arch_of,
    canonical_hash,
    canonical_json,
    canonical_params,
    check_family,
    params_text,
    variant_key,
    variant_label,
)
from ._launch import PreparedLaunch
from ._params import (
    InputWord,
    KernelParam,
    ParamLayout,
    Word,
    default_params,
    input_words,
    params_to_json,
    symbol_bindings,
)
from ._registry import Kernel, LoadStats, Registry
from ._tensor_maps import MAP_ELEMENT_BYTES, TensorMap
from .errors import (
    ArgError,
    B12xError,
    CaptureError,
    CudaError,
    ExpressionError,
    IntegrityError,
    LaunchArgumentError,
    LoaderError,
    ManifestError,
    RegistryClosedError,
    RegistryFormatError,
    RequirementError,
    VariantMissError,
    short_repr,
)

__all__ = [
    "DTYPES",
    "KEY_SCHEMA_VERSION",
    "MAP_ELEMENT_BYTES",
    "READABLE_SCHEMA",
    "SCALAR_KINDS",
    "TRACED",
    "Arg",
    "ArgError",
    "B12xError",
    "Buffer",
    "CaptureError",
    "CudaError",
    "DType",
    "Expr",
    "ExpressionError",
    "Geometry",
    "IndexEntry",
    "InputWord",
    "IntegrityError",
    "Kernel",
    "KernelParam",
    "LaunchArgumentError",
    "LoadStats",
    "LoaderError",
    "Manifest",
    "ManifestError",
    "ParamLayout",
    "ParamRange",
    "PreparedLaunch",
    "Registry",
    "RegistryClosedError",
    "RegistryFormatError",
    "Requirement",
    "RequirementError",
    "ScalarKind",
    "StaticGeometry",
    "TensorMap",
    "TensorView",
    "UncheckedSizeWarning",
    "VariantId",
    "VariantMissError",
    "Word",
    "arch_of",
    "blob_path",
    "canonical_hash",
    "canonical_json",
    "canonical_params",
    "cdiv",
    "check",
    "check_family",
    "current_device",
    "default_params",
    "ensure_init",
    "input_words",
    "params_text",
    "params_to_json",
    "rehearse",
    "schema_version_of",
    "short_repr",
    "symbol_bindings",
    "tdiv",
    "tensor_fields",
    "tmod",
    "variant_key",
    "variant_label",
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
