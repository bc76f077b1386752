"""The all-reduce torch ops over communicators of :mod:`b12x_aot.comm`.

``register_all_reduce(comm)`` returns an op ``b12x::all_reduce(inp, handle) -> out`` bound to
``comm``, whose :meth:`AllReduceOp.rmsnorm` calls the fused
``b12x::all_reduce_rmsnorm(inp, residual, gamma, eps, handle) -> (out, residual_out)``
(``Communicator.all_reduce_rmsnorm``). Both are functional, with a fake (meta) implementation, so it runs eagerly, inside CUDA graphs
and under ``torch.compile(fullgraph=True)``. It launches on torch's current stream, validates
its input at the boundary (the communicator's own checks: dtype, device, contiguity, a
multiple of 8 elements, capacity), and every rank must call it in the same order, as any
all-reduce. One op per namespace serves every communicator of the process: each registered
communicator gets an integer handle that the compiled graph carries as a constant.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from b12x_aot.comm import CommArgumentError, Communicator

__all__ = ["AllReduceOp", "register_all_reduce"]

_lock = threading.Lock()
_handles = itertools.count(1)
_communicators: dict[int, Communicator] = {}
_ops: dict[str, tuple[Any, Any]] = {}  # namespace -> the ops (all_reduce, all_reduce_rmsnorm)


def _communicator(handle: int) -> Communicator:
    comm = _communicators.get(handle)
    if comm is None:
        raise CommArgumentError(
            "all_reduce handle",
            "names no registered communicator",
            handle,
            "Register the communicator with register_all_reduce(comm) and call the op it returns",
        )
    return comm


def _define(namespace: str) -> tuple[Any, Any]:
    @torch.library.custom_op(f"{namespace}::all_reduce", mutates_args=())
    def all_reduce(inp: torch.Tensor, handle: int) -> torch.Tensor:
        return _communicator(handle).all_reduce(inp, stream=torch.cuda.current_stream(inp.device))

    @all_reduce.register_fake
    def _(inp, handle):  # type: ignore[no-untyped-def]
        torch._check(inp.numel() % 8 == 0, lambda: "all_reduce: the element count must be a multiple of 8")
        return torch.empty_like(inp)

    @torch.library.custom_op(f"{namespace}::all_reduce_rmsnorm", mutates_args=())
    def all_reduce_rmsnorm(
        inp: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float, handle: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stream = torch.cuda.current_stream(inp.device)
        return _communicator(handle).all_reduce_rmsnorm(inp, residual, gamma, eps, stream=stream)

    @all_reduce_rmsnorm.register_fake
    def _(inp, residual, gamma, eps, handle):  # type: ignore[no-untyped-def]
        torch._check(
            residual.shape == inp.shape, lambda: "all_reduce_rmsnorm: residual must have inp's shape"
        )
        torch._check(gamma.shape == inp.shape[-1:], lambda: "all_reduce_rmsnorm: gamma must be (hidden,)")
        return torch.empty_like(inp), torch.empty_like(inp)

    return all_reduce, all_reduce_rmsnorm


class AllReduceOp:
    """``{namespace}::all_reduce`` bound to one communicator; call it like ``comm.all_reduce``,
    and :meth:`rmsnorm` like ``comm.all_reduce_rmsnorm``."""

    __slots__ = ("comm", "handle", "op", "rmsnorm_op")

    def __init__(self, comm: Communicator, ops: tuple[Any, Any], handle: int) -> None:
        self.comm, (self.op, self.rmsnorm_op), self.handle = comm, ops, handle

    def __call__(self, inp: torch.Tensor) -> torch.Tensor:
        return self.op(inp, self.handle)

    def rmsnorm(
        self, inp: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, residual_out)`` of ``{namespace}::all_reduce_rmsnorm``."""
        return self.rmsnorm_op(inp, residual, gamma, eps, self.handle)

    def unregister(self) -> None:
        """Forget the communicator (graphs that captured this op must not replay after)."""
        _communicators.pop(self.handle, None)


def register_all_reduce(comm: Communicator, *, namespace: str = "b12x") -> AllReduceOp:
    """The ``{namespace}::all_reduce`` and ``all_reduce_rmsnorm`` ops (defined on first use)
    bound to ``comm``."""
    with _lock:
        ops = _ops.get(namespace)
        if ops is None:
            ops = _ops[namespace] = _define(namespace)
        handle = next(_handles)
        _communicators[handle] = comm
    return AllReduceOp(comm, ops, handle)
