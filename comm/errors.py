"""Errors raised by ``b12x_aot.comm``. Each says what failed, the bad value, and what to do next.

Every class derives from :class:`CommError`, itself a :class:`~b12x_aot.contract.B12xError`
(the base of every b12x-aot error, the loader's too), so a serving process catches the loader's
and the communicator's errors with one ``except B12xError``. Errors caused by what the caller
passed are also ``ValueError``s.
"""

from __future__ import annotations

from b12x_aot.contract import B12xError

__all__ = [
    "CapacityError",
    "CommArgumentError",
    "CommClosedError",
    "CommError",
    "CommTimeoutError",
    "ExchangeError",
    "OccupancyError",
    "PeerMismatchError",
    "PeerSetupError",
    "RendezvousError",
]


class CommError(B12xError):
    """Base class of every error the communicator runtime raises."""


class CommArgumentError(CommError, ValueError):
    """An argument the caller passed is wrong: ``what`` ``problem`` (got ``got``). ``hint`` says
    what to do instead."""

    exit_code = 2  # bad input

    def __init__(self, what: str, problem: str, got: object, hint: str = "") -> None:
        super().__init__(what, problem, got, hint)
        self.what, self.problem, self.got, self.hint = what, problem, got, hint

    def format_message(self) -> str:
        text = f"{self.what} {self.problem} (got {self.got})"
        return f"{text}. {self.hint}" if self.hint else text


class CapacityError(CommArgumentError):
    """A payload larger than the communicator's data slots."""

    def __init__(self, rank: int, nbytes: int, capacity_bytes: int) -> None:
        hint = (
            f"Create the communicator with capacity_bytes >= {nbytes} on every rank, or split the "
            "tensor into calls of at most the capacity"
        )
        super().__init__(
            f"all-reduce on rank {rank}",
            f"exceeds the communicator's capacity of {capacity_bytes} bytes",
            f"{nbytes} bytes",
            hint,
        )
        self.rank, self.nbytes, self.capacity_bytes = rank, nbytes, capacity_bytes


class CommClosedError(CommError):
    """A call on a communicator after :meth:`Communicator.close`."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.rank = rank

    def format_message(self) -> str:
        return (
            f"the communicator of rank {self.rank} is closed. Create a new one with "
            "Communicator.create on every rank (creation is collective)."
        )


class CommTimeoutError(CommError):
    """A kernel gave up waiting for a peer at a barrier and recorded it in the error record.

    The communicator's flags and counters no longer agree across ranks, so it stays unusable:
    every later call raises this again until every rank closes and recreates it.
    """

    def __init__(
        self, rank: int, missing_rank: int, barrier: int, block: int, generation: int, timeout_s: float
    ) -> None:
        super().__init__(rank, missing_rank, barrier, block, generation, timeout_s)
        self.rank, self.missing_rank, self.barrier = rank, missing_rank, barrier
        self.block, self.generation, self.timeout_s = block, generation, timeout_s

    def format_message(self) -> str:
        return (
            f"all-reduce on rank {self.rank} timed out after {self.timeout_s:g} s: CTA {self.block} "
            f"waited at barrier {self.barrier} for rank {self.missing_rank} (generation "
            f"{self.generation}). The communicator is now unusable; close it and recreate it on "
            f"every rank. Check that rank {self.missing_rank} is alive and that every rank issues "
            "the same all-reduce calls in the same order."
        )


class RendezvousError(CommError):
    """An all-gather between the ranks failed: a peer never came, hung up, or disagreed."""

    def __init__(self, rank: int, problem: str, hint: str = "") -> None:
        super().__init__(rank, problem, hint)
        self.rank, self.problem, self.hint = rank, problem, hint

    def format_message(self) -> str:
        text = f"rendezvous on rank {self.rank}: {self.problem}"
        return f"{text}. {self.hint}" if self.hint else text


class ExchangeError(CommError):
    """Passing a window's file descriptor between two processes failed."""

    def __init__(self, address: str, problem: str, hint: str = "") -> None:
        super().__init__(address, problem, hint)
        self.address, self.problem, self.hint = address, problem, hint

    def format_message(self) -> str:
        text = f"fd exchange with {self.address}: {self.problem}"
        return f"{text}. {self.hint}" if self.hint else text


class PeerMismatchError(CommError):
    """Two ranks created their communicators with different settings."""

    def __init__(self, rank: int, peer: int, field: str, ours: object, theirs: object) -> None:
        super().__init__(rank, peer, field, ours, theirs)
        self.rank, self.peer, self.field, self.ours, self.theirs = rank, peer, field, ours, theirs

    def format_message(self) -> str:
        return (
            f"rank {self.rank} and rank {self.peer} disagree on {self.field}: rank {self.rank} has "
            f"{self.ours!r}, rank {self.peer} has {self.theirs!r}. Create the communicator with the "
            "same settings (and the same registry) on every rank."
        )


class PeerSetupError(CommError):
    """Another rank failed while the ranks created their communicators together."""

    def __init__(self, rank: int, peer: int, error: str) -> None:
        super().__init__(rank, peer, error)
        self.rank, self.peer, self.error = rank, peer, error

    def format_message(self) -> str:
        return (
            f"rank {self.rank} cannot create its communicator because rank {self.peer} failed: "
            f"{self.error}. Fix rank {self.peer}'s error; every rank must then create again."
        )


class OccupancyError(CommError):
    """The kernel's grid cannot be resident all at once, which its spin barriers require."""

    def __init__(self, variant: str, blocks: int, ranks_here: int, per_sm: int, sms: int) -> None:
        super().__init__(variant, blocks, ranks_here, per_sm, sms)
        self.variant, self.blocks, self.ranks_here = variant, blocks, ranks_here
        self.per_sm, self.sms = per_sm, sms

    def format_message(self) -> str:
        need = self.blocks * self.ranks_here
        return (
            f"{self.variant} needs {need} co-resident CTAs ({self.blocks} blocks x {self.ranks_here} "
            f"rank(s) on this device) but the device holds only {self.per_sm} per SM x {self.sms} SMs "
            f"= {self.per_sm * self.sms}. Its spin barriers would wait forever. Pick a policy with "
            "fewer blocks or cta_threads, or put fewer ranks on one device."
        )
