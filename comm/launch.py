"""Start one process per GPU for a communicator job, and forward how they end.

    python -m b12x_aot.comm.launch --nproc N [--devices 0,1,..] script.py [args...]

Each child runs ``script.py args...`` with the current interpreter and these variables:
``RANK`` (0..N-1), ``WORLD_SIZE`` (N), ``LOCAL_RANK`` (= RANK: one host),
``B12X_COMM_DEVICE`` (the device it should use: ``--devices[RANK]``, default RANK),
``B12X_COMM_RENDEZVOUS`` (a Unix socket path in a fresh temporary directory, removed at the
end), ``CUDA_VISIBLE_DEVICES`` removed (every child sees every GPU, so device ordinals agree),
and NVLink multicast kept off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``). ``Communicator.from_env`` reads them.

The launcher exits 0 when every child does. When one fails (non-zero exit or a signal), the
others are stopped (SIGTERM, then SIGKILL after a grace period) and the launcher exits with
the first failure's code (128 + signal for a signal). SIGINT/SIGTERM to the launcher stop
every child.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from ._settings import (
    ENV_DEVICE,
    ENV_LOCAL_RANK,
    ENV_RANK,
    ENV_RENDEZVOUS,
    ENV_WORLD_SIZE,
    NO_MULTICAST_ENV,
)
from .errors import CommArgumentError

__all__ = ["child_env", "main", "run"]

GRACE_S = 5.0  # between SIGTERM and SIGKILL when stopping the others
_POLL_S = 0.05


def child_env(base: dict[str, str], *, rank: int, world: int, device: int, rendezvous: str) -> dict[str, str]:
    """The environment of rank ``rank``'s process, from ``base``."""
    env = dict(base)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(NO_MULTICAST_ENV)
    env[ENV_RANK] = str(rank)
    env[ENV_WORLD_SIZE] = str(world)
    env[ENV_LOCAL_RANK] = str(rank)
    env[ENV_DEVICE] = str(device)
    env[ENV_RENDEZVOUS] = rendezvous
    return env


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every running child's process group, then SIGKILL what outlives the grace."""
    alive = [p for p in procs if p.poll() is None]
    for proc in alive:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for proc in alive:
        if proc.poll() is None:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited between poll and kill
        os.killpg(proc.pid, sig)  # the child leads its own group: its helpers stop with it


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run(argv: Sequence[str], *, nproc: int, devices: Sequence[int] | None = None) -> int:
    """Run ``argv`` (a script and its arguments) as ``nproc`` ranks; return the exit code."""
    devices = list(devices) if devices is not None else list(range(nproc))
    if len(devices) != nproc:
        raise CommArgumentError("--devices", f"must name one device per process ({nproc})", devices)
    tmp = tempfile.mkdtemp(prefix="b12x-comm-")
    rendezvous = os.path.join(tmp, "rendezvous.sock")
    procs: list[subprocess.Popen[bytes]] = []
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for rank in range(nproc):
            env = child_env(
                dict(os.environ), rank=rank, world=nproc, device=devices[rank], rendezvous=rendezvous
            )
            procs.append(subprocess.Popen([sys.executable, *argv], env=env, start_new_session=True))
        while True:
            if stopping:
                _stop(procs)
                return 128 + stopping[0]
            codes = [p.poll() for p in procs]
            failed = next((c for c in codes if c not in (None, 0)), None)
            if failed is not None:
                rank = codes.index(failed)
                print(
                    f"b12x_aot.comm.launch: rank {rank} exited with {_code(failed)}; stopping the others",
                    file=sys.stderr,
                )
                _stop(procs)
                return _code(failed)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(_POLL_S)
    finally:
        _stop(procs)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(tmp, ignore_errors=True)


def _devices(text: str) -> list[int]:
    try:
        return [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--devices must be comma-separated ints (got {text!r})") from None


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m b12x_aot.comm.launch",
        description="Start one process per GPU with RANK, WORLD_SIZE, LOCAL_RANK, B12X_COMM_DEVICE "
        "and B12X_COMM_RENDEZVOUS set; exit non-zero if any fails.",
    )
    parser.add_argument("--nproc", type=int, required=True, help="number of processes (ranks)")
    parser.add_argument("--devices", type=_devices, default=None, help="device of each rank, e.g. 0,1,2,3")
    parser.add_argument("script", help="the Python script each rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    opts = parser.parse_args(args)
    if opts.nproc < 1:
        parser.error(f"--nproc must be at least 1 (got {opts.nproc})")
    if opts.devices is not None and len(opts.devices) != opts.nproc:
        parser.error(f"--devices must name one device per process ({opts.nproc}; got {opts.devices})")
    return run([opts.script, *opts.args], nproc=opts.nproc, devices=opts.devices)


if __name__ == "__main__":
    sys.exit(main())
