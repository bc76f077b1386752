"""What a communicator is created with: its validated settings, the policy, the variant choice.

:class:`Settings` holds what every rank must agree on, checked once. A :class:`Policy` names the preferred launch shape (CTA threads, blocks), the default
transport, and the payload size from which two-shot replaces one-shot. :func:`choose_variants`
turns it into one concrete variant per (dtype, algorithm, transport) from what the registry
actually holds, deterministically, so every rank that opens the same registry picks the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import CommArgumentError
from .layout import MAX_WORLD, PACK_BYTES

__all__ = [
    "ABI",
    "ALGORITHMS",
    "DTYPE_BYTES",
    "FAMILY",
    "TRANSPORTS",
    "Policy",
    "Settings",
    "Variant",
    "choose_variants",
    "required_keys",
]

FAMILY = "comm.allreduce"
ABI = 2  # 2: worlds up to 16, the window layout of MAX_WORLD 16
ALGORITHMS = ("oneshot", "twoshot")
TRANSPORTS = ("pull", "push")
DTYPE_BYTES: Mapping[str, int] = {"bf16": 2, "fp16": 2}
_MAX_I32 = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class Policy:
    """How a communicator picks its variant.

    ``cta_threads`` and ``blocks`` are preferences: when the registry lacks them, the nearest
    built values are used (see :func:`choose_variants`). ``transport`` is the default
    transport; ``algorithm`` is one-shot for payloads below ``twoshot_from_bytes`` and two-shot
    from there on. Per-call ``algorithm=``/``transport=`` arguments override both.
    """

    cta_threads: int = 512
    blocks: int = 16
    transport: str = "pull"
    twoshot_from_bytes: int = 512 * 1024

    def __post_init__(self) -> None:
        for name in ("cta_threads", "blocks", "twoshot_from_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CommArgumentError(f"Policy.{name}", "must be a positive int", repr(value))
        if self.transport not in TRANSPORTS:
            raise CommArgumentError("Policy.transport", f"must be one of {TRANSPORTS}", repr(self.transport))

    def algorithm_for(self, nbytes: int) -> str:
        return "oneshot" if nbytes < self.twoshot_from_bytes else "twoshot"


class Variant(NamedTuple):
    """One ``comm.allreduce`` variant's params (without ``world``, which the communicator fixes)."""

    dtype: str
    algorithm: str
    transport: str
    cta_threads: int
    blocks: int

    @property
    def key(self) -> tuple[str, str, str]:
        return self.dtype, self.algorithm, self.transport

    def params(self, world: int) -> dict[str, Any]:
        return {**self._asdict(), "world": world}


def required_keys(dtypes: Iterable[str], policy: Policy, slot_bytes: int) -> list[tuple[str, str, str]]:
    """The (dtype, algorithm, transport) keys the policy can choose for payloads up to ``slot_bytes``:
    creation fails when one of them is not built."""
    algorithms = []
    if policy.twoshot_from_bytes > PACK_BYTES:  # the smallest payload is one pack
        algorithms.append("oneshot")
    if slot_bytes >= policy.twoshot_from_bytes:
        algorithms.append("twoshot")
    return [(d, a, policy.transport) for d in dtypes for a in algorithms]


def choose_variants(
    built: Iterable[Mapping[str, Any]], *, world: int, dtypes: Iterable[str], policy: Policy
) -> dict[tuple[str, str, str], Variant]:
    """For every (dtype, algorithm, transport) built for ``world``, the variant to launch.

    ``built`` are the params of the registry's ``comm.allreduce`` variants for the device's
    arch. Among the (cta_threads, blocks) pairs built for a key, the policy's own pair wins;
    otherwise the nearest cta_threads (ties: the larger), then the nearest blocks (ties: the
    smaller). Keys with nothing built are absent; the caller decides which ones it requires.
    """
    wanted = set(dtypes)
    shapes: dict[tuple[str, str, str], set[tuple[int, int]]] = {}
    for params in built:
        try:
            if params["world"] != world or params["dtype"] not in wanted:
                continue
            key = (params["dtype"], params["algorithm"], params["transport"])
            shape = (int(params["cta_threads"]), int(params["blocks"]))
        except KeyError:
            continue  # a variant of another shape of this family: not one this runtime launches
        shapes.setdefault(key, set()).add(shape)

    def rank(shape: tuple[int, int]) -> tuple[int, int, int, int]:
        threads, blocks = shape
        return (abs(threads - policy.cta_threads), -threads, abs(blocks - policy.blocks), blocks)

    return {key: Variant(*key, *min(found, key=rank)) for key, found in sorted(shapes.items())}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Settings:
    """One rank's validated creation arguments; all but ``rank`` must match on every rank.

    ``slot_bytes`` is the caller's ``capacity_bytes`` rounded up to 16 (one pack): the largest
    payload of one call. Build it with :meth:`of`, which raises :class:`CommArgumentError`.
    """

    rank: int
    world: int
    slot_bytes: int
    dtypes: tuple[str, ...]
    timeout_s: float
    policy: Policy

    @classmethod
    def of(
        cls,
        *,
        rank: Any,
        world: Any,
        capacity_bytes: Any,
        dtypes: Any,
        timeout_s: Any,
        policy: Any,
    ) -> Settings:
        if not _is_int(world) or not 2 <= world <= MAX_WORLD:
            raise CommArgumentError("world", f"must be an int in [2, {MAX_WORLD}]", repr(world))
        if not _is_int(rank) or not 0 <= rank < world:
            raise CommArgumentError("rank", f"must be an int in [0, world={world})", repr(rank))
        # The kernel counts a slot in 16-bit elements (an i32): at most _MAX_I32 rounded down to a pack.
        if not _is_int(capacity_bytes) or not 0 < capacity_bytes <= 2 * (_MAX_I32 - 7):
            raise CommArgumentError(
                "capacity_bytes", f"must be an int in [1, {2 * (_MAX_I32 - 7)}]", repr(capacity_bytes)
            )
        names = tuple(dtypes) if not isinstance(dtypes, str) else (dtypes,)
        if not names or len(set(names)) != len(names) or any(d not in DTYPE_BYTES for d in names):
            raise CommArgumentError(
                "dtypes", f"must be distinct names from {tuple(DTYPE_BYTES)}", repr(dtypes)
            )
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s < 1e9:
            raise CommArgumentError("timeout_s", "must be a number of seconds in (0, 1e9)", repr(timeout_s))
        policy = Policy() if policy is None else policy
        if not isinstance(policy, Policy):
            raise CommArgumentError("policy", "must be a b12x_aot.comm.Policy", type(policy).__name__)
        slot_bytes = -(-capacity_bytes // PACK_BYTES) * PACK_BYTES
        return cls(rank, world, slot_bytes, names, float(timeout_s), policy)
