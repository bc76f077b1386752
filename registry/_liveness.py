"""Whether a build recorded as running still has a process behind it.

A build row says ``running`` from its first write until the builder finishes it; a builder
killed outright (``kill -9``, a lost machine) never does. The row records the builder's host
and pid, so on that host a running build whose process is gone (or whose pid now belongs to a
process started after the build) is shown, and on the next build recorded, as ``interrupted``.
A build from another host cannot be checked here and keeps what it says.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["INTERRUPTED", "seen_status"]

INTERRUPTED = "interrupted"


def _started(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch, where /proc tells (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name before ")" may hold spaces
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _alive(pid: int, since: datetime) -> bool:
    """Whether process ``pid`` exists and is no younger than a build started at ``since``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    started = _started(pid)
    if since.tzinfo is None:  # SQLite hands back the stored UTC time without its zone
        since = since.replace(tzinfo=timezone.utc)
    # A pid handed to a newer process after the builder died (a second's slack for rounding).
    return started is None or started <= since.timestamp() + 1.0


def seen_status(status: str, host: str, pid: int | None, started_at: datetime) -> str:
    """The status to show for a build row: ``interrupted`` for a running build of this host
    whose process is gone, else the recorded status."""
    if status != "running" or pid is None or host != socket.gethostname():
        return status
    return status if _alive(pid, started_at) else INTERRUPTED
