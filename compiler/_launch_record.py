"""From the launch a host function issues to the launch a variant records, checked against its spec.

The host launch (``_host_launch``) says what the DSL decided: each kernel parameter's words,
the grid, the block, the dynamic shared memory and the cluster. The spec says what its author
declared. This module holds the two together:

- block, shared memory and cluster the spec declares must equal the host function's; what it
  leaves out is taken from there;
- a declared grid must give the host function's grid wherever it is evaluated: at a fixed set
  of sample inputs (symbols, scalars and strides drawn by a seeded generator, respecting the
  spec's divisibility and ``requires``); a grid left out is recorded as the host computes it;
- the kernel parameters are recorded where they are not the spec's arguments as given; a
  registry kernel (``AotKernel``) must take exactly those.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from b12x_aot.contract import (
    Arg,
    Expr,
    ExpressionError,
    Geometry,
    InputWord,
    KernelParam,
    StaticGeometry,
    Word,
    default_params,
    input_words,
    params_to_json,
)

from ._host_launch import HostLaunch, LaunchParam
from ._samples import sample_inputs
from ._tensor_map import MAP_TYPE, read_tensor_map
from ._terms import Term, evaluate, render
from .errors import ContractError

__all__ = ["RecordedLaunch", "record_launch"]

_SAMPLES = 48
_DRAWS = 20_000  # inputs drawn at most: requirements such as "rank < world" reject most draws
_SIZES = (0, 1, 2, 3, 5, 8, 16, 17, 31, 64, 100, 127, 128, 129, 255, 1000, 1024, 4095, 4096, 8191)
_CODES = {("int", 1): "B", ("int", 8): "b", ("int", 16): "h", ("int", 32): "i", ("int", 64): "q"}
_CODES.update({("float", 16): "e", ("float", 32): "f", ("float", 64): "d", ("ptr", 64): "Q"})


@dataclass(frozen=True, slots=True)
class RecordedLaunch:
    """What the registry records of a variant's launch: its geometry JSON (the spec's, with
    what the spec left out filled in, and ``params`` where the kernel's parameters are not the
    arguments as given) and the static geometry it launches with."""

    launch: dict[str, Any]
    static: StaticGeometry
    params: tuple[KernelParam, ...]


def _word_code(leaf_kind: str, bits: int, term: Term, inputs: Mapping[str, InputWord]) -> str:
    """A word's struct code. A word that is an input word as it is keeps that word's code (an
    unsigned scalar stays unsigned); any other takes its LLVM type's, signed."""
    code = _CODES.get((leaf_kind, bits))
    if code is None:
        raise ContractError(f"a kernel parameter word of type {leaf_kind}{bits} is not supported")
    if term[0] == "in" and term[1] in inputs:
        own = inputs[term[1]].code
        if struct.calcsize(own) == struct.calcsize(code):
            return own
    return code


def _param(
    param: LaunchParam,
    ordinal: int,
    args: Sequence[Arg],
    inputs: Mapping[str, InputWord],
    params: Mapping[str, Any],
) -> KernelParam:
    if param.type == MAP_TYPE:
        return KernelParam.of_map(read_tensor_map(param, ordinal, args, inputs, params))
    words = []
    for lf, term in zip(param.layout.leaves, param.words, strict=True):
        if term is None:
            raise ContractError(f"kernel parameter {ordinal} ({param.type}): word {lf.path} is never set")
        words.append(Word(lf.offset, _word_code(lf.kind, lf.bits, term, inputs), render(term)))
    return KernelParam(param.layout.size, param.layout.align, tuple(words))


def _loader_can_evaluate(
    params: Sequence[KernelParam],
    host: HostLaunch,
    inputs: Mapping[str, InputWord],
    values: Mapping[str, Any],
) -> None:
    """Every recorded word and grid dimension parses in the loader's expression language and
    reads only input words and params."""
    known = set(inputs) | set(values)
    exprs = [
        (f"kernel parameter {i} word at +{w.offset}", w.expr) for i, p in enumerate(params) for w in p.words
    ]
    exprs += [
        (f"kernel parameter {i}'s tensor map", e)
        for i, p in enumerate(params)
        if p.tmap is not None
        for e in (*p.tmap.dims, *p.tmap.strides)
    ]
    exprs += [(f"grid dimension {'xyz'[i]}", render(g)) for i, g in enumerate(host.grid)]
    for what, source in exprs:
        try:
            names = Expr.parse(source).names
        except ExpressionError as exc:
            raise ContractError(
                f"{what} is {source}, which the loader cannot compute ({exc.reason})"
            ) from None
        if names - known:
            raise ContractError(
                f"{what} reads {', '.join(sorted(names - known))}, which no launch argument supplies"
            )


def _describe(param: KernelParam) -> str:
    if param.tmap is not None:
        return f"{param.size} B ({param.tmap.describe()})"
    words = ", ".join(f"{w.expr} as {w.code}" for w in param.words) or "no words"
    return f"{param.size} B ({words})"


def _strict_params(
    derived: Sequence[KernelParam], expected: Sequence[KernelParam], args: Sequence[Arg]
) -> None:
    """A registry kernel passes each spec argument on as its own parameter, nothing else."""
    problems = []
    if len(derived) != len(expected):
        problems.append(
            f"the spec declares {len(expected)} arguments ({', '.join(a.name for a in args)}); "
            f"the kernel takes {len(derived)} parameters"
        )
    for i, (d, e) in enumerate(zip(derived, expected, strict=False)):
        if d.tmap is not None or (d.size, [(w.code, w.expr) for w in d.words]) != (
            e.size,
            [(w.code, w.expr) for w in e.words],
        ):
            problems.append(
                f"argument {i} {args[i].name!r} ({args[i].kind}): the spec packs {_describe(e)}, "
                f"the kernel takes {_describe(d)}"
            )
    if problems:
        raise ContractError(
            "launch contract broken (a registry kernel's parameters are the spec's arguments as given):\n  "
            + "\n  ".join(problems)
        )


def _check_grid(
    spec_grid: Sequence[Expr],
    host: HostLaunch,
    geometry: Geometry,
    args: Sequence[Arg],
    params: Mapping[str, Any],
) -> None:
    words = input_words(args, params)
    rng = random.Random(0)
    compared = 0
    for _ in range(_DRAWS):  # until _SAMPLES inputs that meet the requirements are compared
        if compared == _SAMPLES:
            break
        try:
            env = sample_inputs(args, words, params, rng, _SIZES)
            if not all(r.evaluate(env) for r in geometry.requires):
                continue
            want = tuple(e.evaluate(env) for e in spec_grid)
        except (ArithmeticError, ExpressionError, TypeError):
            continue  # the spec's grid is undefined here: the loader never launches these inputs
        try:
            got = tuple(evaluate(term, env) for term in host.grid)
        except ArithmeticError:
            continue  # the host function divides by zero here: the DSL's call would fail too
        except KeyError as exc:
            raise ContractError(
                f"the kernel's host function's grid reads {exc}, which is no input word"
            ) from None
        compared += 1
        if want != got:
            runtime = ", ".join(
                f"{w.name}={env[w.name]}" for w in words if w.part in ("value", "shape", "stride")
            )
            raise ContractError(
                f"the spec's grid {[e.source for e in spec_grid]} gives {want} for {runtime}, but the "
                f"kernel's host function launches {got} there ({', '.join(render(g) for g in host.grid)}); "
                "fix launch.grid, or leave it out to record the host function's"
            )
    if not compared:
        raise ContractError(
            f"the spec's grid could not be compared with the kernel's host function's at any of {_DRAWS} "
            "sample inputs (every one broke launch.requires or left the grid undefined); relax the "
            "requirements, or leave launch.grid out to record the host function's"
        )


def record_launch(
    host: HostLaunch, geometry: Geometry, args: Sequence[Arg], params: Mapping[str, Any], *, strict: bool
) -> RecordedLaunch:
    """Check the host launch against the spec's geometry and arguments; what to record of it.
    Raises :class:`ContractError` naming both sides of a disagreement."""
    expanded = geometry.expanded()
    declared = geometry.bind_static(params)
    problems = []
    if declared.block is not None and declared.block != host.block:
        problems.append(
            f"the spec's block is {declared.block}; the kernel's host function launches {host.block}"
        )
    if declared.smem is not None and declared.smem != host.smem:
        problems.append(
            f"the spec's dynamic shared memory is {declared.smem} B; the kernel's host function launches "
            f"with {host.smem} B (leave launch.smem out to take the kernel's)"
        )
    if geometry.cluster is not None and declared.cluster != host.cluster:
        problems.append(
            f"the spec's cluster is {declared.cluster}; the kernel's host function launches {host.cluster}"
        )
    if problems:
        raise ContractError("launch geometry disagrees with the kernel's:\n  " + "\n  ".join(problems))
    if expanded.grid is not None:
        _check_grid(expanded.grid, host, expanded, args, params)

    inputs = {w.name: w for w in input_words(args, params)}
    derived = tuple(_param(p, i, args, inputs, params) for i, p in enumerate(host.params))
    _loader_can_evaluate(derived, host, inputs, params)
    expected = default_params(args, params)
    if strict:
        _strict_params(derived, expected, args)
    launch = geometry.to_json()
    if geometry.grid is None:
        launch["grid"] = [render(g) for g in host.grid]
    if geometry.block is None:
        launch["block"] = list(host.block)
    if geometry.smem is None:
        launch["smem"] = host.smem
    if geometry.cluster is None and host.cluster is not None:
        launch["cluster"] = list(host.cluster)
    if derived != expected:
        launch["params"] = params_to_json(derived)
    return RecordedLaunch(launch, StaticGeometry(host.block, host.smem, host.cluster), derived)
