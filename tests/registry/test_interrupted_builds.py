"""A build whose process died (kill -9) shows as interrupted, not running, once no process
holds it; the next build records it so."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import TOOLCHAIN, FakeRegistry


def statuses(run_cli, path: Path) -> dict[int, str]:
    return {b["id"]: b["status"] for b in json.loads(run_cli("builds", "-r", path, "--json").stdout)}


def killed_builder(path: Path) -> int:
    """Begin a build in a child process that then dies by SIGKILL; the child's pid."""
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.registry.conftest import TOOLCHAIN
        from b12x_aot.registry import RegistryStore, RegistryWriter
        store = RegistryStore.open({str(path)!r})
        RegistryWriter(store).begin_build(TOOLCHAIN, "b12x-compile killed", None)
        print(os.getpid(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    return int(proc.stdout)


def test_a_build_killed_outright_shows_as_interrupted(fake_registry: FakeRegistry, run_cli) -> None:
    fake_registry.build()
    pid = killed_builder(fake_registry.path)
    with sqlite3.connect(fake_registry.path) as conn:
        assert conn.execute("SELECT status, pid FROM builds WHERE id = 2").fetchone() == ("running", pid)
    assert statuses(run_cli, fake_registry.path) == {1: "ok", 2: "interrupted"}
    # The next build writes down what the audits showed.
    fake_registry.writer.begin_build(TOOLCHAIN, "b12x-compile next", None)
    with sqlite3.connect(fake_registry.path) as conn:
        assert conn.execute("SELECT status FROM builds WHERE id = 2").fetchone() == ("interrupted",)


def test_a_build_whose_process_lives_or_is_elsewhere_stays_running(
    fake_registry: FakeRegistry, run_cli
) -> None:
    mine = fake_registry.writer.begin_build(TOOLCHAIN, "b12x-compile live", None)  # this process: alive
    elsewhere = fake_registry.writer.begin_build(TOOLCHAIN, "b12x-compile far", None)
    with sqlite3.connect(fake_registry.path) as conn:
        conn.execute(
            "UPDATE builds SET host = ?, pid = 1 WHERE id = ?", (f"not-{socket.gethostname()}", elsewhere)
        )
    assert statuses(run_cli, fake_registry.path) == {mine: "running", elsewhere: "running"}
