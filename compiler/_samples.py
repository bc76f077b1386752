"""Sample launch inputs drawn to a spec's rules, for checks that compare two computations.

The planner holds what a spec declares against what the DSL's host function computes (the
grid, a tensor map's encoding) by evaluating both at inputs the loader could be given: every
symbol and scalar drawn from ``sizes`` (a symbol scaled to its declared divisibility), every
tensor mode whose entry is an expression computed from them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from b12x_aot.contract import Arg, Expr, InputWord

__all__ = ["sample_inputs"]


def sample_inputs(
    args: Sequence[Arg],
    words: Sequence[InputWord],
    params: Mapping[str, Any],
    rng: random.Random,
    sizes: Sequence[int],
    *,
    address: Callable[[random.Random], int] = lambda _: 1 << 40,
    stride_unit: int = 1,
) -> dict[str, Any]:
    """One set of input words (and the runtime names expressions read) consistent with the
    spec; a stride symbol is a multiple of ``stride_unit`` too."""
    env: dict[str, Any] = dict(params)
    divisibility = {name: by for arg in args for name, by in arg.divisibility}
    for w in words:  # scalars and symbols first: the other words are expressions over them
        if w.part == "address":
            env[w.name] = address(rng)
        elif w.part == "value":
            env[w.name] = rng.choice(sizes)
        elif "__" not in w.name:
            unit = stride_unit if w.part == "stride" else 1
            env[w.name] = rng.choice(sizes) * divisibility.get(w.name, 1) * unit
    for w in words:
        if w.part == "data":
            env[w.name] = address(rng)
        elif "__" in w.name and w.part in ("shape", "stride"):
            arg = args[w.arg]
            entry = (arg.shape if w.part == "shape" else arg.stride)[w.mode]  # type: ignore[index]
            unit = stride_unit if w.part == "stride" else 1
            env[w.name] = (
                rng.choice(sizes) * unit if entry.strip() == w.name else Expr.parse(entry).evaluate(env)
            )
    return env
