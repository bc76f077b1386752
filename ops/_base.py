"""What every registry-backed torch op shares: its variants resolved once per thread and cached."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch

from b12x_aot.contract import DTYPES
from b12x_aot.loader import LaunchArgumentError, PreparedLaunch, Registry

__all__ = ["RegistryOp", "dtype_name"]

_DTYPE_NAMES = {getattr(torch, DTYPES[n].torch_name): n for n in ("fp32", "fp16", "bf16")}


def dtype_name(dtype: torch.dtype, what: str) -> str:
    """The spec's name of ``dtype`` (``bf16``...); raises :class:`LaunchArgumentError` naming
    ``what`` for a dtype no op takes."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise LaunchArgumentError("torch op", what, "must be float32, float16 or bfloat16", dtype) from None


class RegistryOp:
    """A registry, and the launches resolved from it, cached by their inputs' signature.

    Each thread keeps its own launches: a :class:`PreparedLaunch` packs its arguments into one
    buffer, so two threads sharing one could launch each other's. The variants are loaded once
    (the registry is shared), so a thread's first call makes no driver call and may run inside
    a graph capture once any thread has preloaded.
    """

    family = ""

    def __init__(self, registry: Registry, *, abi: int = 1, namespace: str = "b12x") -> None:
        self.registry = registry
        self.abi = abi
        self.namespace = namespace
        self._local = threading.local()
        self.op = self._define()

    def _define(self) -> Any:
        """Define the ``torch.library`` op (once per namespace)."""
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the op with the arguments of its schema (see the family's ``_define``)."""
        return self.op(*args, **kwargs)

    def _launch(
        self, key: Hashable, device: int, choices: Sequence[Mapping[str, Any]], family: str | None = None
    ) -> PreparedLaunch:
        """The first of ``choices`` (full param sets, best first) that the registry holds; when
        it holds none, the miss of the first (with its nearest variants)."""
        launches: dict[Hashable, PreparedLaunch] = self._local.__dict__.setdefault("launches", {})
        launch = launches.get(key)
        if launch is not None:
            return launch
        family = family or self.family
        arch = self.registry.arch(device)
        held = next((p for p in choices if self.registry.holds(family, self.abi, arch=arch, **p)), choices[0])
        kernel = self.registry.kernel(family, self.abi, device=device, **held)
        launch = launches[key] = kernel.prepare(device=device)
        return launch
