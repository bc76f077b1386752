"""Virtual ranks: several communicators on one GPU in one process, each on its own stream.

Used by the one-GPU tests and the protocol benchmark. Every rank's kernel must run while the
others run, so all ranks share one device's SMs (the occupancy check counts them together).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from b12x_aot.loader import Registry

from ._communicator import Communicator
from ._device import current_device
from ._policy import Policy, Settings
from ._rendezvous import ThreadRendezvous
from .errors import CommArgumentError, PeerSetupError

__all__ = ["create_local_group"]


def create_local_group(
    registry: Registry,
    *,
    world: int,
    capacity_bytes: int,
    device: int | None = None,
    dtypes: Sequence[str] = ("bf16", "fp16"),
    timeout_s: float = 10.0,
    policy: Policy | None = None,
    streams: Sequence[Any] | None = None,
) -> list[Communicator]:
    """``world`` communicators on ONE GPU in this process (virtual ranks), rank order.

    Each rank gets its own stream (``streams[r]``, or a new non-blocking stream it owns), uses
    its peers' windows by address, and needs every rank's kernel running concurrently: issue
    one call on every rank (any order, one thread is enough) before waiting for any of them.
    Streams that share a hardware work queue serialise, and a rank queued behind a spinning
    peer would time out: start the process with ``CUDA_DEVICE_MAX_CONNECTIONS`` above
    ``world`` (the driver's default is 8), e.g. 32. Virtual ranks test and time the protocol,
    not multi-GPU bandwidth. The ranks use each other's windows by address, so close them all
    together, after their last calls have finished (a rank still calling into a closed peer's
    window faults the context). Raises like :meth:`Communicator.create`; on failure nothing
    stays allocated.
    """
    first = Settings.of(  # bad arguments raise here, before any thread or driver work
        rank=0, world=world, capacity_bytes=capacity_bytes, dtypes=dtypes, timeout_s=timeout_s, policy=policy
    )
    settings = [dataclasses.replace(first, rank=rank) for rank in range(world)]
    device = current_device() if device is None else device
    if streams is not None and len(streams) != world:
        raise CommArgumentError("streams", f"must hold one stream per rank ({world})", len(streams))
    group = ThreadRendezvous(world, timeout=60.0)
    made: list[Communicator | None] = [None] * world
    failed: list[BaseException | None] = [None] * world

    def one(rank: int) -> None:
        try:
            made[rank] = Communicator._create(
                registry,
                settings[rank],
                rendezvous=group.member(rank),
                device=device,
                stream=streams[rank] if streams is not None else None,
                own_stream=streams is None,
            )
        except BaseException as exc:  # handed to the calling thread below
            failed[rank] = exc

    threads = [threading.Thread(target=one, args=(r,), name=f"b12x-comm rank {r}") for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors = [e for e in failed if e is not None]
    if errors:
        for comm in made:
            if comm is not None:
                comm.close()
        # The failing rank's own error explains the others' PeerSetupErrors.
        raise next((e for e in errors if not isinstance(e, PeerSetupError)), errors[0])
    return [c for c in made if c is not None]
