"""b12x-aot comm: a multi-process all-reduce runtime over CUDA IPC, on top of the loader.

Each rank owns a window of device memory (``cuMemCreate``, shared with peers as a POSIX fd over
a Unix socket) holding its counters, barrier flags, peer table and data slots; the
``comm.allreduce`` kernels from the registry read and write their peers' windows directly.
Creating a communicator needs only an all-gather of bytes between the ranks (a
:data:`Rendezvous`). Imports only the stdlib, ``cuda.bindings`` and the loader; torch only when
the caller passes tensors or asks for :func:`torch_rendezvous`. Never uses NVLink multicast.

One process per GPU, started by ``python -m b12x_aot.comm.launch --nproc N script.py``::

    from b12x_aot.comm import Communicator
    from b12x_aot.loader import Registry

    registry = Registry.open("kernels.db")
    with Communicator.from_env(registry, capacity_bytes=8 << 20) as comm:
        out = comm.all_reduce(x)  # x: a contiguous bf16/fp16 CUDA tensor, numel % 8 == 0

With ``torch.distributed`` already initialised::

    comm = Communicator.create(registry, rank=rank, world=world, capacity_bytes=8 << 20,
                               rendezvous=torch_rendezvous())

Virtual ranks (every rank a stream of one GPU, for tests and protocol benchmarks)::

    comms = create_local_group(registry, world=4, capacity_bytes=1 << 20)
"""

from ._communicator import Communicator
from ._device import DeviceContext
from ._exchange import FdServer, fetch_fd
from ._group import create_local_group
from ._policy import Policy, Variant
from ._rendezvous import Rendezvous, ThreadRendezvous, UnixSocketRendezvous, torch_rendezvous
from ._settings import (
    ENV_DEVICE,
    ENV_LOCAL_RANK,
    ENV_RANK,
    ENV_RENDEZVOUS,
    ENV_WORLD_SIZE,
    LaunchEnv,
    read_launch_env,
)
from ._window import Window
from .errors import (
    CapacityError,
    CommArgumentError,
    CommClosedError,
    CommError,
    CommTimeoutError,
    ExchangeError,
    OccupancyError,
    PeerMismatchError,
    PeerSetupError,
    RendezvousError,
)
from .layout import WindowLayout

__all__ = [
    "ENV_DEVICE",
    "ENV_LOCAL_RANK",
    "ENV_RANK",
    "ENV_RENDEZVOUS",
    "ENV_WORLD_SIZE",
    "CapacityError",
    "CommArgumentError",
    "CommClosedError",
    "CommError",
    "CommTimeoutError",
    "Communicator",
    "DeviceContext",
    "ExchangeError",
    "FdServer",
    "LaunchEnv",
    "OccupancyError",
    "PeerMismatchError",
    "PeerSetupError",
    "Policy",
    "Rendezvous",
    "RendezvousError",
    "ThreadRendezvous",
    "UnixSocketRendezvous",
    "Variant",
    "Window",
    "WindowLayout",
    "create_local_group",
    "fetch_fd",
    "read_launch_env",
    "torch_rendezvous",
]
