"""Creating a communicator collectively: local setup, the descriptor exchange, peer mapping.

Every rank runs :func:`build` with the same arguments but its own ``rank``. It takes exactly
two rendezvous rounds (one when some rank fails before the first):

1. local setup (preload the variants, measure occupancy, allocate and reset the window and the
   error record, start the fd server), then all-gather the :class:`PeerInfo` descriptors;
2. check that every rank agrees, map every other process's window from its fd, write the peer
   table, synchronise, check the grid fits, then all-gather a status: the barrier after which
   any rank may launch, because every peer has zeroed its flags.

A rank that fails still takes part in the round it is in, so its peers fail at once with a
:class:`PeerSetupError` instead of waiting for a timeout.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import asdict, astuple, dataclass, field
from typing import Any, NamedTuple

from cuda.bindings import driver as cu

from b12x_aot.loader import Kernel, PreparedLaunch, Registry

from ._device import DeviceContext, ErrorRecord, check, raw_stream
from ._exchange import FdServer, fetch_fd
from ._fused import FusedLaunch, choose_fused, load_fused
from ._policy import ABI, FAMILY, Settings, Variant, choose_variants, required_keys
from ._rendezvous import Rendezvous
from ._window import Window
from .errors import CommError, OccupancyError, PeerMismatchError, PeerSetupError, RendezvousError
from .layout import WindowLayout

__all__ = ["Built", "PeerInfo", "Resources", "build", "check_peers", "ranks_sharing_device"]

FETCH_TIMEOUT_S = 30.0  # every fd server is listening before its address is published


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What one rank tells the others at creation. ``error`` is non-empty when it failed."""

    rank: int
    world: int
    pid: int = 0
    hostname: str = ""
    device: int = -1
    device_uuid: str = ""
    window_bytes: int = 0
    window_va: int = 0
    fd_address: str = ""
    slot_bytes: int = 0
    dtypes: tuple[str, ...] = ()
    variants: tuple[tuple[Any, ...], ...] = ()
    policy: tuple[Any, ...] = ()  # the Policy's fields: every rank must pick the same algorithm
    fused: tuple[tuple[Any, ...], ...] = ()  # the comm.allreduce_rmsnorm variants loaded
    error: str = ""

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, me: int, sender: int) -> PeerInfo:
        try:
            raw = json.loads(data)
            raw["dtypes"] = tuple(raw["dtypes"])
            raw["variants"] = tuple(tuple(v) for v in raw["variants"])
            raw["policy"] = tuple(raw["policy"])
            raw["fused"] = tuple(tuple(v) for v in raw["fused"])
            return cls(**raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise RendezvousError(
                me,
                f"rank {sender} sent an unreadable descriptor ({exc})",
                "Run the same b12x-aot version on every rank",
            ) from None


def check_peers(me: PeerInfo, infos: Sequence[PeerInfo]) -> None:
    """Raise if any peer failed or disagrees with ``me`` on what must be common to all ranks."""
    if len(infos) != me.world:
        raise RendezvousError(
            me.rank, f"the rendezvous returned {len(infos)} descriptors for world {me.world}"
        )
    for sender, info in enumerate(infos):
        if info.error and sender != me.rank:
            raise PeerSetupError(me.rank, sender, info.error)
    for sender, info in enumerate(infos):
        if info.rank != sender:
            raise PeerMismatchError(
                me.rank, sender, "its rank (position in the rendezvous)", sender, info.rank
            )
        for name, ours, theirs in (
            ("world", me.world, info.world),
            ("capacity (slot bytes)", me.slot_bytes, info.slot_bytes),
            ("dtypes", me.dtypes, info.dtypes),
            ("the policy", me.policy, info.policy),
            ("the chosen comm.allreduce variants", me.variants, info.variants),
            ("the loaded comm.allreduce_rmsnorm variants", me.fused, info.fused),
            ("the host", me.hostname, info.hostname),
        ):
            if ours != theirs:
                raise PeerMismatchError(me.rank, sender, name, ours, theirs)
        if info.pid == me.pid and info.device_uuid != me.device_uuid:
            raise CommError(
                f"ranks {me.rank} and {sender} share process {me.pid} but use different GPUs "
                f"({me.device} and {info.device}). Ranks of one process must share one device "
                "(virtual ranks); put ranks on other GPUs in their own processes."
            )
        if info.pid != me.pid and info.device_uuid == me.device_uuid:
            raise CommError(
                f"ranks {me.rank} and {sender} are different processes ({me.pid}, {info.pid}) on the "
                f"same GPU (device {me.device}, uuid {me.device_uuid}): their kernels cannot be "
                "resident together, so the spin barriers would time out. Run one process per GPU, "
                "or several ranks of one process on one GPU with create_local_group."
            )


def ranks_sharing_device(me: PeerInfo, infos: Sequence[PeerInfo]) -> int:
    """How many ranks (``me`` included) run their kernels on ``me``'s GPU at the same time."""
    return sum(1 for i in infos if i.device_uuid == me.device_uuid)


@dataclass(slots=True)
class Resources:
    """Everything driver-side one communicator owns; :meth:`close` frees it all, once."""

    ctx: DeviceContext | None = None
    window: Window | None = None
    peers: list[Window] = field(default_factory=list)
    error: ErrorRecord | None = None
    server: FdServer | None = None
    stream: int | None = None  # created for this communicator: destroyed at close
    rendezvous: Any = None  # created for this communicator: closed at close
    closed: bool = False

    def synchronize(self, stream: Any = None) -> None:
        if self.ctx is not None:
            self.ctx.synchronize(stream)

    def close(self) -> None:
        """Wait for the device, then unmap and free. Idempotent; the first failure is raised
        after everything else has been released."""
        if self.closed:
            return
        self.closed = True
        failures: list[BaseException] = []

        def attempt(fn: Any) -> None:
            try:
                fn()
            except Exception as exc:  # keep releasing; the first failure is raised below
                failures.append(exc)

        ctx = self.ctx
        if ctx is not None and self.window is not None:
            attempt(ctx.synchronize)  # kernels may still read the windows and the record
        if self.server is not None:
            attempt(self.server.close)
        for peer in self.peers:
            attempt(peer.close)
        if self.window is not None:
            attempt(self.window.close)
        if self.error is not None:
            attempt(self.error.close)
        if ctx is not None and self.stream is not None:
            stream = self.stream
            attempt(lambda: ctx.destroy_stream(stream))
        if self.rendezvous is not None:
            attempt(self.rendezvous.close)
        if ctx is not None:
            attempt(ctx.close)
        if failures:
            raise failures[0]


class Built(NamedTuple):
    """What :func:`build` hands the communicator (the resources themselves stay in
    :class:`Resources`)."""

    variants: dict[tuple[str, str, str], Variant]
    launches: dict[tuple[str, str, str], PreparedLaunch]
    fused: dict[tuple[str, int], FusedLaunch]  # by (dtype, hidden)
    window_va: int
    error_words: Any  # the host view of the error record
    stream: Any  # the default launch stream (None: the loader's default)


def _preload(
    registry: Registry, device: int, settings: Settings, stream: Any
) -> tuple[dict[tuple[str, str, str], Variant], dict[tuple[str, str, str], Kernel]]:
    """Choose and load every variant this communicator may launch, before any capture."""
    world, dtypes, policy = settings.world, settings.dtypes, settings.policy
    arch = registry.arch(device)
    built = [e.params for e in registry.entries() if e.family == FAMILY and e.abi == ABI and e.arch == arch]
    variants = choose_variants(built, world=world, dtypes=dtypes, policy=policy)
    for key in required_keys(dtypes, policy, settings.slot_bytes):
        if key not in variants:  # the registry's own miss error names the nearest and the fix
            want = Variant(*key, policy.cta_threads, policy.blocks)
            registry.kernel(FAMILY, ABI, device=device, stream=stream, **want.params(world))
    kernels = {
        key: registry.kernel(FAMILY, ABI, device=device, stream=stream, **v.params(world))
        for key, v in variants.items()
    }
    return variants, kernels


def _resident_per_sm(ctx: DeviceContext, kernel: Kernel) -> int:
    """How many CTAs of ``kernel`` one SM of ``ctx``'s device holds at once."""
    with ctx:
        return int(
            check(
                cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    kernel.function(ctx.device), kernel.static.threads, kernel.static.smem
                ),
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            )
        )


def _together(
    rendezvous: Rendezvous, payload: bytes, error: BaseException | None, resources: Resources
) -> list[bytes]:
    """One all-gather in which this rank also reports its own failure: it takes part even when
    it failed (so its peers learn of it at once), then raises; nothing stays allocated."""
    try:
        replies = rendezvous(payload)
    except BaseException:
        resources.close()
        raise
    if error is not None:
        resources.close()
        raise error
    return replies


def build(
    registry: Registry,
    settings: Settings,
    *,
    rendezvous: Rendezvous,
    device: int,
    stream: Any,
    own_stream: bool,
    resources: Resources,
) -> Built:
    """Create this rank's share of a communicator (see the module docstring). With
    ``own_stream`` a new stream is created for it and becomes its default. On any failure
    ``resources`` is closed and the error raised; every rank raises too."""
    rank, world, slot_bytes, dtypes = settings.rank, settings.world, settings.slot_bytes, settings.dtypes
    layout = WindowLayout(world, slot_bytes)
    local_error: BaseException | None = None
    try:
        stream = raw_stream(stream)  # a bad one fails here, where every rank hears of it
        resources.ctx = ctx = DeviceContext(device)
        ctx.make_current_if_none()
        if own_stream:
            resources.stream = stream = ctx.create_stream()
        variants, kernels = _preload(registry, device, settings, stream)
        per_sm = {key: _resident_per_sm(ctx, kernel) for key, kernel in kernels.items()}
        launches = {key: k.prepare(device=device, stream=stream) for key, k in kernels.items()}
        fused_kernels = load_fused(registry, device, settings, stream)
        fused_per_sm = {v: _resident_per_sm(ctx, k) for v, k in fused_kernels.items()}
        fused_launches = {v: k.prepare(device=device, stream=stream) for v, k in fused_kernels.items()}
        resources.window = window = Window.allocate(ctx, layout.bytes)
        resources.error = ErrorRecord(ctx)
        window.reset_control(int(settings.timeout_s * 1e9), resources.error.device_ptr)
        resources.server = FdServer(window.fd)
        me = PeerInfo(
            rank=rank,
            world=world,
            pid=os.getpid(),
            hostname=socket.gethostname(),
            device=device,
            device_uuid=ctx.uuid(),
            window_bytes=window.size,
            window_va=window.va,
            fd_address=resources.server.address,
            slot_bytes=slot_bytes,
            dtypes=dtypes,
            variants=tuple(tuple(v) for _, v in sorted(variants.items())),
            policy=astuple(settings.policy),
            fused=tuple(tuple(v) for v in sorted(fused_kernels)),
        )
    except Exception as exc:  # re-raised below, once the peers have heard of it
        local_error = exc
        me = PeerInfo(rank=rank, world=world, error=f"{type(exc).__name__}: {exc}")
    replies = _together(rendezvous, me.encode(), local_error, resources)
    try:
        infos = [PeerInfo.decode(b, rank, r) for r, b in enumerate(replies)]
    except BaseException:
        resources.close()
        raise
    failed = next((r for r, i in enumerate(infos) if i.error), None)
    if failed is not None:
        resources.close()
        raise PeerSetupError(rank, failed, infos[failed].error)

    status = b""
    try:
        check_peers(me, infos)
        addresses = []
        for info in infos:
            if info.rank == rank:
                addresses.append(window.va)
            elif info.pid == me.pid:
                addresses.append(info.window_va)  # same process: the owner's mapping is ours
            else:
                fd, _ = fetch_fd(info.fd_address, timeout=FETCH_TIMEOUT_S)
                peer = Window.map_peer(ctx, fd, info.window_bytes)
                resources.peers.append(peer)
                addresses.append(peer.va)
        window.write_peers(addresses)
        ctx.synchronize()  # cuMemsetD8 may still be running; peers may launch after the barrier
        sharing = ranks_sharing_device(me, infos)
        sms = ctx.sm_count()
        for key, launch in launches.items():
            if per_sm[key] * sms < variants[key].blocks * sharing:
                raise OccupancyError(launch.name, variants[key].blocks, sharing, per_sm[key], sms)
        fused = choose_fused(fused_launches, fused_per_sm, sms, sharing)
    except Exception as exc:  # re-raised after the barrier, once the peers have heard of it
        local_error = exc
        status = f"{type(exc).__name__}: {exc}".encode()
    statuses = _together(rendezvous, status, local_error, resources)
    failed = next((r for r, s in enumerate(statuses) if s), None)
    if failed is not None:
        resources.close()
        raise PeerSetupError(rank, failed, statuses[failed].decode(errors="replace"))
    # Every peer has imported our window: the fd and its server are no longer needed.
    resources.server.close()  # type: ignore[union-attr]
    window.close_fd()
    return Built(variants, launches, fused, window.va, resources.error.words, stream)  # type: ignore[union-attr]
