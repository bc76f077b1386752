"""Builds on a dask.distributed cluster (``--executor tcp://...``) against a 2-worker LocalCluster.

The client records every outcome itself; the same plan gives the same registry as the local
pool; hangs, crashed children and workers killed mid-task end as rows, never as a hung build;
a killed client resumes; a worker with different sources is refused before anything compiles.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ..conftest import ONE_ARCH, ONE_VARIANT, ROOT, TOPK_SMALL, run_compile, run_compile_after, write_spec
from .test_build import consistent, current

distributed = pytest.importorskip("distributed")

pytestmark = [pytest.mark.dsl, pytest.mark.slow]

# A kernel package of this test's own: the variant's ``mode`` param says how its construction
# (inside the worker's compile child) behaves.
FAKE_KERNEL = """
import os
import signal
import time

from b12x_aot.kernels.topk_sum import TopKSum as _Base


class TopKSum(_Base):
    def __init__(self, geometry, static, *, mode, **params):
        if mode == "hang":
            time.sleep(300)
        elif mode == "crash":
            os._exit(3)
        elif mode == "kill":  # the compile child's parent is the dask worker
            os.kill(os.getppid(), signal.SIGKILL)
        super().__init__(geometry, static, **params)
"""


def fake_spec(modes: str) -> str:
    return (
        ONE_ARCH.replace("b12x_aot.kernels.topk_sum:TopKSum", "fakekernels.topk_sum:TopKSum")
        .replace("output: [fp32, bf16]", "output: [fp32]")
        .replace("topk: [2]", f"topk: [2]\n  mode: [{modes}]")
    )


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pkgs")
    (root / "fakekernels").mkdir()
    (root / "fakekernels" / "__init__.py").write_text("")
    (root / "fakekernels" / "topk_sum.py").write_text(FAKE_KERNEL)
    return root


@pytest.fixture(scope="module")
def env(pkgs: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(pkgs)}


@pytest.fixture(scope="module")
def scheduler_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scheduler") / "scheduler.json"


@pytest.fixture(scope="module")
def cluster(pkgs: Path, scheduler_file: Path) -> Iterator[str]:
    """A LocalCluster of 2 nanny-managed (so daemonic) workers that see the fake package; its
    address, and its scheduler writes ``scheduler_file``."""
    import dask

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(pkgs)
    sys.path.insert(0, str(pkgs))  # spawned workers start from this process's sys.path
    # One death per task is enough to prove a worker-killing variant ends as a failure.
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 1}),
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"scheduler_file": str(scheduler_file)},
        ) as local,
    ):
        yield local.scheduler_address
    sys.path.remove(str(pkgs))
    if saved is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = saved


def build(spec: Path, db: Path, executor: str, *extra: str, env: dict, check: bool = True):
    """Run b12x-compile; a build that hangs fails the test after a few minutes."""
    proc = run_compile(
        str(spec),
        "--registry",
        str(db),
        "--executor",
        executor,
        "--json",
        *extra,
        env=env,
        check=check,
        timeout=300,
    )
    return proc, (json.loads(proc.stdout) if proc.stdout.strip() else None)


def failures(db: Path) -> dict[str, tuple[str, str]]:
    """``mode -> (kind, reason)`` of each recorded failure."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT params_json, kind, reason FROM failures").fetchall()
    return {json.loads(p)["mode"]: (kind, reason) for p, kind, reason in rows}


def test_a_cluster_build_equals_a_local_build(tmp_path: Path, cluster: str, env: dict) -> None:
    spec = write_spec(
        tmp_path, "topk.yaml", TOPK_SMALL.replace("[sm_90a, sm_100a, sm_120a]", "[sm_90a, sm_120a]")
    )
    with distributed.Client(cluster, set_as_default=False) as client:
        # The workers are daemonic (nanny-managed), and still start their compile children.
        assert set(client.run(lambda: multiprocessing.current_process().daemon).values()) == {True}
    local, remote = tmp_path / "local.db", tmp_path / "dask.db"
    _, on_cluster = build(spec, remote, cluster, env=env)
    _, on_pool = build(spec, local, "local", "-j", "2", env=env)
    assert on_cluster["built"] == on_pool["built"] == 8 and not on_cluster["failed"]
    assert current(remote) == current(local)  # the same keys and artifact sha256s
    consistent(remote)


def test_hangs_and_crashes_end_as_rows_while_the_rest_land(tmp_path: Path, cluster: str, env: dict) -> None:
    spec = write_spec(tmp_path, "fake.yaml", fake_spec("ok, hang, crash"))
    db = tmp_path / "r.db"
    proc, summary = build(spec, db, cluster, "--timeout", "10", env=env, check=False)
    assert proc.returncode == 1, proc.stderr
    assert summary["built"] == 2 and len(current(db)) == 2  # mode=ok, both CTA sizes
    rows = failures(db)
    assert set(rows) == {"hang", "crash"}
    assert rows["hang"][0] == "timeout" and "exceeded the 10 s timeout" in rows["hang"][1]
    assert rows["crash"][0] == "failed" and "compile worker died (exit code 3)" in rows["crash"][1]
    # As locally: a timeout is retried by the next plan, a crash is a recorded failure.
    plan = run_compile(str(spec), "--registry", str(db), "--dry-run", "--json", env=env)
    assert json.loads(plan.stdout)["counts"] == {
        "present": 2,
        "new": 2,
        "stale": 0,
        "failed": 2,
        "rejected": 0,
        "pruned": 0,
    }


def test_a_variant_that_kills_workers_ends_as_a_failure(
    tmp_path: Path, cluster: str, scheduler_file: Path, env: dict
) -> None:
    spec = write_spec(tmp_path, "fake.yaml", fake_spec("kill"))
    db = tmp_path / "r.db"
    executor = f"dask+file://{scheduler_file}"  # the same cluster, found through its scheduler file
    proc, summary = build(spec, db, executor, "--where", "cta_threads=128", env=env, check=False)
    assert proc.returncode == 1, proc.stderr
    assert summary["built"] == 0 and len(summary["failed"]) == 1
    kind, reason = failures(db)["kill"]
    assert kind == "failed" and "dask workers died 2 times while running it" in reason


def test_a_killed_client_resumes(tmp_path: Path, cluster: str, env: dict) -> None:
    text = (
        ONE_ARCH.replace("topk: [2]", "topk: [1, 2, 4]")
        .replace("hidden: [2048]", "hidden: [1024, 2048]")
        .replace('constraints: ["hidden % (cta_threads * 8) == 0"]', "constraints: []")
    )
    spec = write_spec(tmp_path, "medium.yaml", text)  # 24 variants
    db = tmp_path / "r.db"
    args = [str(spec), "--registry", str(db), "--executor", cluster]
    client = subprocess.Popen(
        [sys.executable, "-m", "b12x_aot.compiler", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and client.poll() is None:
        try:
            if db.exists() and len(current(db)) >= 3:
                break
        except sqlite3.OperationalError:
            pass  # the schema is not there yet
        time.sleep(0.1)
    assert client.poll() is None, "the build finished before it could be killed; grow the spec"
    client.kill()  # the client alone: the cluster and its in-flight tasks carry on
    client.wait()
    partial = current(db)
    assert 3 <= len(partial) < 24
    consistent(db)
    _, summary = build(spec, db, cluster, env=env)
    assert summary["planned"]["present"] == len(partial) and summary["built"] == 24 - len(partial)
    final = current(db)
    assert len(final) == 24 and all(final[k] == sha for k, sha in partial.items())
    consistent(db)


def test_a_worker_with_other_sources_is_refused(tmp_path: Path, cluster: str, env: dict) -> None:
    spec = write_spec(tmp_path, "fake.yaml", fake_spec("ok"))
    other = tmp_path / "other"
    (other / "fakekernels").mkdir(parents=True)
    (other / "fakekernels" / "__init__.py").write_text("")
    edited = FAKE_KERNEL + "# edited on one worker only\n"
    (other / "fakekernels" / "topk_sum.py").write_text(edited)
    with distributed.Client(cluster, set_as_default=False) as client:
        worker = sorted(client.scheduler_info()["workers"])[0]
        # Lambdas travel by value, so they run on the worker's own sys.path.
        client.run(lambda path: sys.path.insert(0, path), str(other), workers=[worker])
        try:
            db = tmp_path / "r.db"
            proc, _ = build(spec, db, cluster, env=env, check=False)
        finally:
            client.run(lambda path: sys.path.remove(path), str(other), workers=[worker])
    assert proc.returncode == 2, proc.stderr
    message = " ".join(proc.stderr.split())
    ours, theirs = (hashlib.sha256(text.encode()).hexdigest() for text in (FAKE_KERNEL, edited))
    assert (
        f"worker {worker}: source of fakekernels.topk_sum: client has {ours}, worker has {theirs}" in message
    )
    assert message.count("fakekernels.topk_sum") == 1  # only that worker, only that module
    assert "wrong provenance" in message
    assert not current(db)  # nothing compiled, nothing recorded
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM builds").fetchone()[0] == 0


def test_a_late_worker_checks_itself_before_its_first_compile(
    monkeypatch: pytest.MonkeyPatch, pkgs: Path
) -> None:
    # A worker that joins after the client's check compares itself in the build's plugin.
    from b12x_aot.compiler import Fingerprint, ToolchainError, environment_fingerprint
    from b12x_aot.compiler._dask_worker import CompilePlugin

    monkeypatch.syspath_prepend(str(pkgs))
    own = environment_fingerprint(["fakekernels.topk_sum"])
    theirs = tuple((what, "release 0.0" if what == "ptxas" else value) for what, value in own.items)
    plugin = CompilePlugin(Fingerprint(own.modules, theirs))
    plugin.setup(SimpleNamespace(address="tcp://10.0.0.9:40000"))
    try:
        for _ in range(2):  # every task it gets is refused, before any child starts
            with pytest.raises(ToolchainError) as refused:
                plugin.compile(SimpleNamespace(arch="sm_90a"), 10.0)
            assert re.search(
                r"worker tcp://10\.0\.0\.9:40000: ptxas: client has release 0\.0, worker has release \d+\.\d+",
                refused.value.format_message(),
            )
    finally:
        plugin.teardown(None)


def _drop_nvdisasm() -> None:
    """On a worker: as if nvdisasm were not installed there."""
    from b12x_aot.compiler import _sass

    _sass.find_nvdisasm = lambda: None


def _restore_nvdisasm() -> None:
    import importlib

    from b12x_aot.compiler import _sass

    importlib.reload(_sass)


def test_a_worker_without_nvdisasm_is_refused_as_a_local_build_is(
    tmp_path: Path, cluster: str, env: dict
) -> None:
    spec = write_spec(tmp_path, "fake.yaml", fake_spec("ok"))  # max_spill_bytes: 0 needs SASS
    with distributed.Client(cluster, set_as_default=False) as client:
        worker = sorted(client.scheduler_info()["workers"])[0]
        client.run(_drop_nvdisasm, workers=[worker])
        try:
            db = tmp_path / "r.db"
            proc, summary = build(spec, db, cluster, env=env, check=False)
        finally:
            client.run(_restore_nvdisasm, workers=[worker])
    assert proc.returncode == 2, proc.stderr
    assert summary == {"ok": False, "error": summary["error"], "exit_code": 2}
    message = " ".join(proc.stderr.split())
    assert (
        f"nvdisasm not found on worker {worker}, and the limits (max_spill_bytes, async_wgmma) of" in message
    )
    assert "pip install nvidia-cuda-nvdisasm" in message
    assert not current(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM builds").fetchone()[0] == 0


def test_a_late_worker_without_nvdisasm_refuses_sass_limits(
    monkeypatch: pytest.MonkeyPatch, pkgs: Path
) -> None:
    from b12x_aot.compiler import ToolchainError, _sass, environment_fingerprint
    from b12x_aot.compiler._dask_worker import CompilePlugin

    monkeypatch.syspath_prepend(str(pkgs))
    monkeypatch.setattr(_sass, "find_nvdisasm", lambda: None)
    plugin = CompilePlugin(environment_fingerprint(["fakekernels.topk_sum"]), ("specs/fake.yaml",))
    plugin.setup(SimpleNamespace(address="tcp://10.0.0.9:40000"))
    try:
        with pytest.raises(ToolchainError) as refused:
            plugin.compile(SimpleNamespace(arch="sm_90a"), 10.0)
        assert "nvdisasm not found on worker tcp://10.0.0.9:40000, and the limits" in (
            refused.value.format_message()
        )
    finally:
        plugin.teardown(None)


def test_a_local_build_never_imports_dask(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "s.yaml", ONE_VARIANT)
    loaded = "print('loaded', [m for m in ('dask', 'distributed') if m in sys.modules])\n"
    out = run_compile_after(
        "", str(spec), "--registry", str(tmp_path / "r.db"), "-j", "1", "--json", epilogue=loaded
    )
    assert out.returncode == 0, out.stderr
    assert '"built": 1' in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "loaded []"
