"""The environment variables of the multi-process launcher: declared here, and only here.

``python -m b12x_aot.comm.launch`` writes them into each child; :meth:`Communicator.from_env`
reads them back through :func:`read_launch_env`. Nothing else in the package reads the
environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from .errors import CommArgumentError

__all__ = [
    "ENV_DEVICE",
    "ENV_LOCAL_RANK",
    "ENV_RANK",
    "ENV_RENDEZVOUS",
    "ENV_WORLD_SIZE",
    "NO_MULTICAST_ENV",
    "LaunchEnv",
    "read_launch_env",
]

ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_RENDEZVOUS = "B12X_COMM_RENDEZVOUS"  # the Unix socket path of the rank-0 rendezvous hub
ENV_DEVICE = "B12X_COMM_DEVICE"  # the device ordinal to use; LOCAL_RANK when unset

# NVLink multicast (NVLS, multimem) can take a host's shared GPUs out of service; every child
# the launcher starts keeps it off in NCCL, torch's symmetric memory and NVSHMEM.
NO_MULTICAST_ENV: Mapping[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


class LaunchEnv(NamedTuple):
    """Where this process stands in a launched job."""

    rank: int
    world: int
    local_rank: int
    device: int
    rendezvous: str


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None:
        raise CommArgumentError(
            f"environment variable {name}",
            "is not set",
            "nothing",
            "Start the script with `python -m b12x_aot.comm.launch --nproc N script.py`, or pass "
            "rank, world and a rendezvous to Communicator.create",
        )
    try:
        return int(value)
    except ValueError:
        raise CommArgumentError(f"environment variable {name}", "must be an integer", repr(value)) from None


def read_launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read the launcher's variables (default: ``os.environ``); raise naming any missing one."""
    env = os.environ if environ is None else environ
    rank, world, local_rank = _int(env, ENV_RANK), _int(env, ENV_WORLD_SIZE), _int(env, ENV_LOCAL_RANK)
    device = _int(env, ENV_DEVICE) if ENV_DEVICE in env else local_rank
    path = env.get(ENV_RENDEZVOUS)
    if not path:
        raise CommArgumentError(
            f"environment variable {ENV_RENDEZVOUS}",
            "is not set",
            "nothing",
            "Start the script with `python -m b12x_aot.comm.launch --nproc N script.py`",
        )
    if not 0 <= rank < world:
        raise CommArgumentError(f"{ENV_RANK}", f"must be in [0, {ENV_WORLD_SIZE}={world})", rank)
    return LaunchEnv(rank, world, local_rank, device, path)
