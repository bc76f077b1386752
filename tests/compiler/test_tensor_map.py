"""Tensor-map recipes read from descriptor words as the DSL's host code computes them: the
fields decode, each dim and stride is named by the input word it comes from, and a descriptor
the recipe cannot reproduce is refused (hand-built words; the example build reads real ones)."""

from __future__ import annotations

import pytest

from b12x_aot.compiler._host_launch import LaunchParam
from b12x_aot.compiler._llvm_layout import type_layout
from b12x_aot.compiler._tensor_map import MAP_TYPE, _fields, _words, read_tensor_map
from b12x_aot.compiler._terms import const, leaf, op
from b12x_aot.compiler.errors import ContractError
from b12x_aot.contract import Arg, TensorMap, input_words

A = Arg("a", "tensor", "bf16", 16, "in", ("m", "k"), ("lda", "1"), (0, 1), (0,), (("lda", 8),))
FIELDS = {
    "address": 1 << 30,
    "rank": 2,
    "code": 10,  # the descriptor's bf16
    "swizzle": 3,
    "oob_fill": 0,
    "tf32": 0,
    "l2_promotion": 2,
    "strides": [4096 * 16],
    "dims": [512, 300],
    "element_strides": [1, 1],
    "box": [64, 32],
}


def _shl(term, bits: int):
    return op("<<", term, const(bits))


def _dsl_words(k_term, m_term, stride_bytes):
    """Descriptor words as terms, built as the DSL's arithmetic builds them: ``a``'s address,
    dims ``k_term`` and ``m_term``, one stride; the DSL's own bit 1 of word 1 set."""
    constant = _words({**FIELDS, "address": 0, "strides": [0], "dims": [1, 1]})
    minus_one = const(1)
    words = [
        _shl(op(">>", leaf("a", True), const(4)), 4),
        op("|", const(constant[1] | 2), _shl(op(">>", stride_bytes, const(4)), 32)),
        const(0),
        const(0),
        op("|", op("-", k_term, minus_one), _shl(op("-", m_term, minus_one), 32)),
        const(0),
        const(constant[6]),
        const(constant[7]),
    ]
    return LaunchParam(MAP_TYPE, type_layout(MAP_TYPE), (*words, *([None] * 8)))


def _read(param: LaunchParam) -> TensorMap:
    inputs = {w.name: w for w in input_words([A], {})}
    return read_tensor_map(param, 0, [A], inputs, {})


def test_fields_and_words_are_inverse() -> None:
    assert _fields(_words(FIELDS)) == FIELDS


def test_the_recipe_names_the_input_words() -> None:
    stride = op("*", leaf("lda", True), const(2))
    tmap = _read(_dsl_words(leaf("k", True), leaf("m", True), stride))
    assert tmap == TensorMap("a", 9, ("k", "m"), ("lda * 2",), (64, 32), (1, 1), 0, 3, 2, 0)


def test_a_dim_the_loader_cannot_compute_is_refused() -> None:
    stride = op("*", leaf("lda", True), const(2))
    half = op("//", leaf("m", True), const(2))
    with pytest.raises(ContractError, match=r"kernel parameter 0 \(a TMA tensor map\): its dim 1 is neither"):
        _read(_dsl_words(leaf("k", True), half, stride))


def test_bits_the_recipe_does_not_account_for_are_refused() -> None:
    stride = op("*", leaf("lda", True), const(2))
    param = _dsl_words(leaf("k", True), leaf("m", True), stride)
    # a bit of word 5 that depends on the arguments: no field the recipe has explains it
    odd = op("&", leaf("m", True), const(1))
    tampered = LaunchParam(MAP_TYPE, param.layout, (*param.words[:5], _shl(odd, 40), *param.words[6:]))
    with pytest.raises(ContractError, match="does not reproduce the DSL's descriptor"):
        _read(tampered)
