"""The communicator: an all-reduce over CUDA IPC windows, launched from the registry.

Created collectively by ``world`` ranks (processes, or threads of one process for virtual
ranks on one GPU), it owns one window per rank, a host-mapped error record, and the prepared
``comm.allreduce`` launches it may use, all bound at creation. A call validates, picks a
variant from a small dict and launches it; nothing is loaded, looked up or allocated on the
hot path (except the output tensor when the caller passes none).
"""

from __future__ import annotations

import ctypes
import itertools
import sys
from collections.abc import Sequence
from typing import Any

from b12x_aot.contract import DTYPES
from b12x_aot.loader import Registry

from ._device import current_device, decode_error, raw_stream
from ._fused import check_operands, check_rows
from ._policy import ALGORITHMS, DTYPE_BYTES, TRANSPORTS, Policy, Settings
from ._rendezvous import Rendezvous, UnixSocketRendezvous
from ._settings import read_launch_env
from ._setup import Built, Resources, build
from .errors import (
    CapacityError,
    CommArgumentError,
    CommClosedError,
    CommTimeoutError,
)
from .layout import PEERS_OFFSET

__all__ = ["Communicator"]

_FROM_ENV_CALLS = itertools.count()  # the same sequence on every rank: creation is collective


class Communicator:
    """One rank's all-reduce communicator. Built by :meth:`create`, :meth:`from_env` or
    :func:`create_local_group`, never directly.

    Contract:

    - every rank issues the same calls (same sizes, dtypes, algorithm and transport) in the
      same order; the kernels pair calls by count;
    - on each rank, the calls run in issue order: put every call of one communicator on one
      stream (or order the streams yourself). Two calls running at once on one rank would read
      the same call counter and share slots and flags, with no error to show for it;
    - payloads are at most ``capacity_bytes`` and a multiple of 8 elements (one 16-byte pack);
      tails are refused, pad instead;
    - ``out`` is ``inp`` (in place) or does not overlap it at all;
    - a kernel that waits longer than ``timeout_s`` for a peer gives up and records it; the
      next call (or :meth:`check`) raises :class:`CommTimeoutError`, and the communicator stays
      unusable until every rank closes and recreates it;
    - two CUDA graphs captured on one communicator must not replay concurrently (they share
      the window's flags and slots), and a graph replays in the call order of its capture;
    - one communicator is driven by one thread at a time.
    """

    __slots__ = (
        "__weakref__",
        "_capacity",
        "_closed",
        "_ctrl",
        "_error_words",
        "_fused",
        "_launches",
        "_peers_ptr",
        "_resources",
        "_slot_bytes",
        "_stream",
        "_torch",
        "_torch_names",
        "_transport",
        "device",
        "dtypes",
        "policy",
        "rank",
        "timeout_s",
        "variants",
        "world",
    )

    def __init__(self, settings: Settings, *, device: int, built: Built, resources: Any) -> None:
        self.rank, self.world, self.dtypes = settings.rank, settings.world, settings.dtypes
        self.policy, self.timeout_s, self.device = settings.policy, settings.timeout_s, device
        self.variants = built.variants
        self._slot_bytes = settings.slot_bytes
        # the kernel's unit: elements of the (16-bit) dtypes per slot
        self._capacity = settings.slot_bytes // max(DTYPE_BYTES[d] for d in settings.dtypes)
        self._ctrl = built.window_va
        self._peers_ptr = built.window_va + PEERS_OFFSET
        self._launches = built.launches
        self._fused = built.fused
        self._error_words = built.error_words
        self._stream = built.stream
        self._resources = resources
        self._closed = False
        self._transport = settings.policy.transport
        self._torch: Any = None
        self._torch_names: dict[Any, str] | None = None
        if "torch" in sys.modules:
            self._bind_torch()

    # --- creation ----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        registry: Registry,
        *,
        rank: int,
        world: int,
        capacity_bytes: int,
        rendezvous: Rendezvous,
        device: int | None = None,
        dtypes: Sequence[str] = ("bf16", "fp16"),
        timeout_s: float = 10.0,
        stream: Any = None,
        policy: Policy | None = None,
    ) -> Communicator:
        """Create rank ``rank``'s communicator; every rank must call this with the same
        ``world``, ``capacity_bytes``, ``dtypes`` and policy, and its own ``rank``.

        ``rendezvous`` is an all-gather of bytes among the ranks (two rounds are used).
        ``capacity_bytes`` bounds one call's payload (rounded up to 16). ``device`` defaults to
        the current one. ``timeout_s`` bounds how long a kernel waits for a peer. ``stream`` is
        the default launch stream (by default torch's current stream when torch is imported,
        else the legacy stream). ``policy`` picks the variants (default :class:`Policy`).

        Raises :class:`CommArgumentError` for bad arguments, the registry's
        ``VariantMissError`` when a variant the policy needs is not built,
        :class:`OccupancyError` when the grid cannot be co-resident,
        :class:`PeerMismatchError` when ranks disagree, :class:`PeerSetupError` when another
        rank failed, and :class:`RendezvousError` when a rank never came. Every rank fails
        together; nothing stays allocated on failure.
        """
        settings = Settings.of(
            rank=rank,
            world=world,
            capacity_bytes=capacity_bytes,
            dtypes=dtypes,
            timeout_s=timeout_s,
            policy=policy,
        )
        return cls._create(registry, settings, rendezvous=rendezvous, device=device, stream=stream)

    @classmethod
    def _create(
        cls,
        registry: Registry,
        settings: Settings,
        *,
        rendezvous: Rendezvous,
        device: int | None,
        stream: Any,
        own_stream: bool = False,
        own_rendezvous: Any = None,
    ) -> Communicator:
        resources = Resources(rendezvous=own_rendezvous)
        try:
            device = current_device() if device is None else device
        except BaseException:
            resources.close()
            raise
        built = build(
            registry,
            settings,
            rendezvous=rendezvous,
            device=device,
            stream=stream,
            own_stream=own_stream,
            resources=resources,
        )
        return cls(settings, device=device, built=built, resources=resources)

    @classmethod
    def from_env(
        cls,
        registry: Registry,
        capacity_bytes: int,
        *,
        dtypes: Sequence[str] = ("bf16", "fp16"),
        timeout_s: float = 10.0,
        stream: Any = None,
        policy: Policy | None = None,
        rendezvous_timeout: float = 120.0,
    ) -> Communicator:
        """Create this process's communicator from the variables ``python -m
        b12x_aot.comm.launch`` sets (rank, world, device, rendezvous path). The rendezvous it
        opens is closed with the communicator.

        Every rank must call it the same number of times, in the same order: the k-th call
        meets at the launcher's path suffixed ``.k`` (none for the first), so a new
        communicator never reaches the socket of one still closing."""
        env = read_launch_env()
        settings = Settings.of(
            rank=env.rank,
            world=env.world,
            capacity_bytes=capacity_bytes,
            dtypes=dtypes,
            timeout_s=timeout_s,
            policy=policy,
        )
        n = next(_FROM_ENV_CALLS)
        path = env.rendezvous if n == 0 else f"{env.rendezvous}.{n}"
        rendezvous = UnixSocketRendezvous(path, env.rank, env.world, timeout=rendezvous_timeout)
        return cls._create(
            registry,
            settings,
            rendezvous=rendezvous,
            device=env.device,
            stream=stream,
            own_rendezvous=rendezvous,
        )

    # --- properties ----------------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        """The largest payload of one call, in bytes."""
        return self._slot_bytes

    @property
    def stream(self) -> Any:
        """The default launch stream given or created at creation (raw handle), or None."""
        return self._stream

    @property
    def closed(self) -> bool:
        return self._closed

    # --- the hot path --------------------------------------------------------------------------

    def all_reduce(
        self,
        inp: Any,
        out: Any = None,
        *,
        stream: Any = None,
        algorithm: str | None = None,
        transport: str | None = None,
    ) -> Any:
        """Sum ``inp`` over all ranks into ``out`` (allocated with ``torch.empty_like`` when None);
        returns ``out``.

        ``inp`` and ``out`` are contiguous CUDA tensors on this communicator's device, of one of
        its dtypes, with the same dtype and number of elements, the same tensor or not
        overlapping. ``stream`` (a torch stream or raw handle) overrides the default stream
        (keep one communicator's calls on one stream: see the class contract); ``algorithm`` and
        ``transport`` override the policy for this call (every rank must pass the same). A
        zero-element call launches nothing. Raises :class:`CommTimeoutError` first if an
        earlier call timed out, then :class:`CommClosedError`, then the argument errors
        (``ValueError``\\ s) before anything is launched.
        """
        dtype = self._tensor_dtype("all_reduce inp", inp)
        device = inp.device
        if not inp.is_contiguous():
            raise CommArgumentError("all_reduce inp", "must be contiguous", f"strides {tuple(inp.stride())}")
        n = inp.numel()
        if out is None:
            out = self._torch.empty_like(inp)
        else:
            if getattr(out, "dtype", None) != inp.dtype:
                raise CommArgumentError(
                    "all_reduce out", f"must have inp's dtype {inp.dtype}", getattr(out, "dtype", out)
                )
            if out.numel() != n:
                raise CommArgumentError("all_reduce out", f"must have inp's {n} elements", out.numel())
            if out.device != device:
                raise CommArgumentError("all_reduce out", f"must be on inp's device {device}", out.device)
            if not out.is_contiguous():
                raise CommArgumentError(
                    "all_reduce out", "must be contiguous", f"strides {tuple(out.stride())}"
                )
        if n:
            self._launch(out.data_ptr(), inp.data_ptr(), n, dtype, stream, algorithm, transport)
        return out

    def all_reduce_rmsnorm(
        self,
        inp: Any,
        residual: Any,
        gamma: Any,
        eps: float,
        *,
        out: Any = None,
        residual_out: Any = None,
        stream: Any = None,
    ) -> tuple[Any, Any]:
        """``y = all_reduce(inp) + residual``, ``residual_out = y``, ``out = rmsnorm(y) * gamma``
        in one launch; returns ``(out, residual_out)`` (each ``torch.empty_like(inp)`` when None).

        ``inp`` and ``residual`` are contiguous ``(..., hidden)`` CUDA tensors of one of the
        communicator's dtypes, ``gamma`` is ``(hidden,)`` of that dtype, and the rows (tokens)
        are at most the chosen variant's limit (64 at most) and fit ``capacity_bytes``. Each
        output may be ``inp`` or ``residual`` itself. Every rank gets the same bits; the order
        of every fp32 operation is kernels/allreduce_rmsnorm.py's (docs/allreduce.md).
        Zero rows launch nothing. Raises like :meth:`all_reduce`.
        """
        dtype = self._tensor_dtype("all_reduce_rmsnorm inp", inp)
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 <= eps < float("inf"):
            raise CommArgumentError("all_reduce_rmsnorm eps", "must be a finite number >= 0", repr(eps))
        out = self._torch.empty_like(inp) if out is None else out
        residual_out = self._torch.empty_like(inp) if residual_out is None else residual_out
        rows, hidden = check_operands(inp, residual, gamma, out, residual_out)
        if rows:
            fused = self._fused.get((dtype, hidden))
            check_rows(self.rank, fused, dtype, rows, hidden, self._slot_bytes)
            if stream is not None and stream.__class__ is not int:
                stream = raw_stream(stream)
            fused.launch(  # type: ignore[union-attr]
                out.data_ptr(),
                residual_out.data_ptr(),
                inp.data_ptr(),
                residual.data_ptr(),
                gamma.data_ptr(),
                self._peers_ptr,
                self._ctrl,
                self.rank,
                rows,
                self._capacity,
                float(eps),
                stream=stream,
            )
        return out, residual_out

    def all_reduce_raw(
        self,
        out_ptr: int,
        inp_ptr: int,
        num_elements: int,
        dtype: str,
        *,
        stream: Any = None,
        algorithm: str | None = None,
        transport: str | None = None,
    ) -> None:
        """:meth:`all_reduce` on raw device pointers (ints, 16-byte aligned) of ``num_elements``
        elements of ``dtype`` (``"bf16"`` or ``"fp16"``); needs no torch."""
        if self._error_words[0]:
            raise self._timeout_error()
        if self._closed:
            raise CommClosedError(self.rank)
        if dtype not in self.dtypes:
            raise CommArgumentError(
                "all_reduce_raw dtype", f"must be one of the communicator's dtypes {self.dtypes}", repr(dtype)
            )
        for name, value in (("out_ptr", out_ptr), ("inp_ptr", inp_ptr), ("num_elements", num_elements)):
            if value.__class__ is not int or value < 0:
                raise CommArgumentError(f"all_reduce_raw {name}", "must be a non-negative int", repr(value))
        if num_elements:
            self._launch(out_ptr, inp_ptr, num_elements, dtype, stream, algorithm, transport)

    def _launch(
        self,
        out_ptr: int,
        inp_ptr: int,
        n: int,
        dtype: str,
        stream: Any,
        algorithm: str | None,
        transport: str | None,
    ) -> None:
        """The checks common to both entry points, then one prepared launch."""
        if n & 7:
            raise CommArgumentError(
                "all-reduce size",
                "must be a multiple of 8 elements (16-byte packs); tails are not supported",
                f"{n} elements",
                "Pad the buffer to a multiple of 8 elements",
            )
        nbytes = n * DTYPE_BYTES[dtype]
        if nbytes > self._slot_bytes:
            raise CapacityError(self.rank, nbytes, self._slot_bytes)
        if (out_ptr | inp_ptr) & 15:
            raise CommArgumentError(
                "all-reduce buffers", "must be 16-byte aligned", f"out {out_ptr:#x}, inp {inp_ptr:#x}"
            )
        if out_ptr != inp_ptr and out_ptr < inp_ptr + nbytes and inp_ptr < out_ptr + nbytes:
            raise CommArgumentError(
                "all-reduce out",
                "must be inp itself or not overlap it",
                f"out {out_ptr:#x}, inp {inp_ptr:#x}, {nbytes} bytes",
            )
        key = (
            dtype,
            algorithm if algorithm is not None else self.policy.algorithm_for(nbytes),
            transport if transport is not None else self._transport,
        )
        launch = self._launches.get(key)
        if launch is None:
            raise self._missing(key)
        if stream is not None and stream.__class__ is not int:
            stream = raw_stream(stream)
        launch(out_ptr, inp_ptr, self._peers_ptr, self._ctrl, self.rank, n, self._capacity, stream=stream)

    # --- errors and lifecycle -----------------------------------------------------------------

    def _tensor_dtype(self, what: str, inp: Any) -> str:
        """The dtype name of ``inp``, a tensor on this communicator's device, once the
        communicator is known usable (the checks every tensor call starts with)."""
        if self._error_words[0]:
            raise self._timeout_error()
        if self._closed:
            raise CommClosedError(self.rank)
        names = self._torch_names if self._torch_names is not None else self._bind_torch()
        dtype = names.get(getattr(inp, "dtype", None))
        if dtype is None:
            raise CommArgumentError(
                what,
                f"must be a tensor of one of the communicator's dtypes {self.dtypes}",
                getattr(inp, "dtype", type(inp).__name__),
            )
        if inp.device.type != "cuda" or inp.device.index != self.device:
            raise CommArgumentError(what, f"must be on cuda:{self.device}", inp.device)
        return dtype

    def _bind_torch(self) -> dict[Any, str]:
        import torch

        self._torch = torch
        self._torch_names = {getattr(torch, DTYPES[d].torch_name): d for d in self.dtypes}
        return self._torch_names

    def _timeout_error(self) -> CommTimeoutError:
        barrier, missing, block, generation = decode_error(self._error_words[0], self._error_words[1])  # type: ignore[misc]
        return CommTimeoutError(self.rank, missing, barrier, block, generation, self.timeout_s)

    def _missing(self, key: tuple[str, str, str]) -> CommArgumentError:
        _, algorithm, transport = key
        if algorithm not in ALGORITHMS:
            return CommArgumentError("all-reduce algorithm", f"must be one of {ALGORITHMS}", repr(algorithm))
        if transport not in TRANSPORTS:
            return CommArgumentError("all-reduce transport", f"must be one of {TRANSPORTS}", repr(transport))
        built = ", ".join("/".join(k) for k in sorted(self._launches)) or "none"
        return CommArgumentError(
            "all-reduce variant",
            "is not in the registry for this world size",
            "/".join(key),
            f"Built: {built}. Build it with b12x-compile specs/comm_allreduce.yaml, or pick another",
        )

    def check(self, stream: Any = None) -> None:
        """Wait for ``stream`` (default: the communicator's stream, else the whole device) and
        raise :class:`CommTimeoutError` if any call so far timed out. Use it after graph
        replays, which run no host code of their own."""
        if self._closed:
            raise CommClosedError(self.rank)
        self._resources.synchronize(stream if stream is not None else self._stream)
        if self._error_words[0]:
            raise self._timeout_error()

    def close(self) -> None:
        """Wait for the device, then unmap every window and free everything. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._launches = {}
        self._fused = {}
        self._error_words = (ctypes.c_uint32 * 4)()  # the record is freed below; stop reading it
        self._resources.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"capacity={self._slot_bytes}"
        return f"<Communicator rank={self.rank}/{self.world} cuda:{self.device} {state}>"
