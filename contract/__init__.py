"""b12x-aot launch contract: what the compiler records, the registry stores and the loader reads.

The pieces every side shares, in one place: the argument kinds and element types (``Arg``,
``DTYPES``, ``SCALAR_KINDS``), the expression language (``Expr``), launch geometry, the kernel
parameter words and their layout, the TMA tensor-map recipe, the variant identity and its key
(``VariantId``, ``variant_key``, canonical JSON, labels), and the error base ``B12xError`` that
every package's errors derive from.

Imports only the stdlib: the build side and the serving side both stand on it, and it stands
on nothing of theirs.

    from b12x_aot.contract import VariantId

    variant = VariantId.of(family="moe.topk_sum", abi=1, arch="sm_90a", params={"topk": 8})
    variant.key  # the sha256 every tool names this variant by
"""

from ._abi import DTYPES, SCALAR_KINDS, Arg, DType, ScalarKind, tensor_fields
from ._expr import TRACED, Expr, cdiv, tdiv, tmod
from ._geometry import Geometry, StaticGeometry
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
from ._params import (
    InputWord,
    KernelParam,
    ParamLayout,
    Word,
    default_params,
    input_words,
    params_from_json,
    params_to_json,
    symbol_bindings,
)
from ._tensor_maps import MAP_BYTES, MAP_ELEMENT_BYTES, TensorMap
from .errors import ArgError, B12xError, ExpressionError, short_repr

__all__ = [
    "DTYPES",
    "KEY_SCHEMA_VERSION",
    "MAP_BYTES",
    "MAP_ELEMENT_BYTES",
    "SCALAR_KINDS",
    "TRACED",
    "Arg",
    "ArgError",
    "B12xError",
    "DType",
    "Expr",
    "ExpressionError",
    "Geometry",
    "InputWord",
    "KernelParam",
    "ParamLayout",
    "ScalarKind",
    "StaticGeometry",
    "TensorMap",
    "VariantId",
    "Word",
    "arch_of",
    "canonical_hash",
    "canonical_json",
    "canonical_params",
    "cdiv",
    "check_family",
    "default_params",
    "input_words",
    "params_from_json",
    "params_text",
    "params_to_json",
    "short_repr",
    "symbol_bindings",
    "tdiv",
    "tensor_fields",
    "tmod",
    "variant_key",
    "variant_label",
]
