"""b12x-compile's own failure modes, with no kernel compiled: nvdisasm missing, compile children
that cannot start, dry runs, registry errors mid-build, signals, and bad --shard and --arch."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.connection import wait
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy.exc import OperationalError

from b12x_aot.compiler import _child, _pool, _sass, cli
from b12x_aot.compiler._driver import CompileJob, CompileOutcome
from b12x_aot.compiler._executor import Executor
from b12x_aot.compiler._plan import Plan, make_plan
from b12x_aot.compiler._spec import load_specs
from b12x_aot.compiler._status import Status
from b12x_aot.compiler._toolchain import current_toolchain
from b12x_aot.registry import (
    BlobDirError,
    FailureRecord,
    RegistryError,
    RegistryStore,
    RegistryWriter,
)

from ..conftest import ONE_ARCH, ONE_VARIANT, ROOT, write_spec

NO_LIMITS = ONE_VARIANT.replace("limits:\n  max_spill_bytes: 0\n", "")


def compile_cli(*args: str) -> Result:
    return CliRunner().invoke(cli.main, list(args))


def plan_of(spec: Path, store: RegistryStore | None = None, **kwargs: object) -> Plan:
    return make_plan(load_specs([spec]), store, toolchain=current_toolchain(), **kwargs)  # type: ignore[arg-type]


def record(db: Path, plan: Plan, kind: Status, stage: str, reason: str) -> None:
    """A failure of ``kind`` for the plan's first variant, as an earlier build recorded it."""
    store = RegistryStore.open(db, create=True)
    try:
        writer = RegistryWriter(store)
        build = writer.begin_build(plan.toolchain, "b12x-compile earlier", None)
        variant = plan.items[0].variant
        writer.record_failure(
            build, FailureRecord(variant.id, plan.provenance_of(variant), kind, stage, reason, reason)
        )
        writer.finish_build(build, "failed", {})
    finally:
        store.close()


def build_rows(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT status FROM builds ORDER BY id")]


class FakeExecutor(Executor):
    """Ends every job as a compile failure, without compiling."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def describe(self) -> str:
        return "fake"

    def check(self, plan: Plan) -> None:
        pass

    def without_nvdisasm(self) -> list[str]:
        return [] if _sass.find_nvdisasm() is not None else ["this machine"]

    def close(self) -> None:
        pass

    def run_jobs(
        self,
        jobs: Sequence[CompileJob],
        on_outcome: Callable[[CompileOutcome], None],
        *,
        timeout: float | None,
    ) -> None:
        for job in jobs:
            self.seen.append(job.variant.key)
            on_outcome(CompileOutcome(job.variant, Status.FAILED, "compile", "fake", "", 0.0))


# --- 1. nvdisasm missing -------------------------------------------------------------------


def test_missing_nvdisasm_refuses_a_build_whose_limits_need_sass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_sass, "find_nvdisasm", lambda: None)
    spec = write_spec(tmp_path, "s.yaml", ONE_VARIANT)  # max_spill_bytes: 0
    db = tmp_path / "r.db"
    result = compile_cli(str(spec), "--registry", str(db), "--json")
    assert result.exit_code == 2, result.output
    assert "pip install nvidia-cuda-nvdisasm" in result.stderr and str(spec) in result.stderr
    assert json.loads(result.stdout)["exit_code"] == 2
    assert build_rows(db) == []  # nothing began, so nothing can be recorded as rejected


def test_missing_nvdisasm_only_warns_when_no_limit_needs_sass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_sass, "find_nvdisasm", lambda: None)
    monkeypatch.setattr(cli, "executor_from", lambda text, jobs: FakeExecutor([]))
    spec = write_spec(tmp_path, "s.yaml", NO_LIMITS)
    result = compile_cli(str(spec), "--registry", str(tmp_path / "r.db"), "--json")
    assert "warning: nvdisasm not found" in result.stderr
    assert "nvidia-cuda-nvdisasm" in result.stderr


class WorkersWithoutNvdisasm(FakeExecutor):
    """A cluster whose worker has no nvdisasm, though this machine has one."""

    def without_nvdisasm(self) -> list[str]:
        return ["worker tcp://10.0.0.9:40000"]


@pytest.mark.parametrize("where", ["this machine", "worker tcp://10.0.0.9:40000"])
def test_every_executor_refuses_sass_limits_without_nvdisasm_alike(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    seen: list[str] = []
    if where == "this machine":
        monkeypatch.setattr(_sass, "find_nvdisasm", lambda: None)
        monkeypatch.setattr(cli, "executor_from", lambda text, jobs: FakeExecutor(seen))
    else:
        monkeypatch.setattr(_sass, "find_nvdisasm", lambda: "/usr/bin/nvdisasm")
        monkeypatch.setattr(cli, "executor_from", lambda text, jobs: WorkersWithoutNvdisasm(seen))
    spec = write_spec(tmp_path, "s.yaml", ONE_VARIANT)  # max_spill_bytes: 0
    db = tmp_path / "r.db"
    result = compile_cli(str(spec), "--registry", str(db), "--executor", "dask://sched:8786", "--json")
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert (
        f"nvdisasm not found on {where}, and the limits (max_spill_bytes, async_wgmma) of {spec}" in message
    )
    assert "pip install nvidia-cuda-nvdisasm" in message
    assert seen == [] and build_rows(db) == []  # nothing compiled, nothing recorded


def test_undecided_limits_name_what_only_sass_decides() -> None:
    from b12x_aot.compiler._contract import check_limits, undecided_limits
    from b12x_aot.compiler._spec import Limits

    from .test_limits import KERNEL

    framed = replace(KERNEL, frame_bytes=8)
    # A stack frame is not spills: without SASS it decides nothing, and nothing is rejected.
    assert check_limits(Limits(max_spill_bytes=0), framed, None) is None
    assert "max_spill_bytes 0 (stack frame 8 B" in (
        undecided_limits(Limits(max_spill_bytes=0), framed, None) or ""
    )
    assert undecided_limits(Limits(max_spill_bytes=0), KERNEL, None) is None  # a zero frame proves it
    assert undecided_limits(Limits(async_wgmma=True), KERNEL, None) == "async_wgmma"
    assert Limits(max_spill_bytes=0).needs_sass and not Limits(max_registers=64).needs_sass


def test_retry_failed_retries_rejections_made_without_sass(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "s.yaml", ONE_VARIANT)
    db = tmp_path / "r.db"
    record(
        db,
        plan_of(spec),
        Status.REJECTED,
        "limits",
        "stack frame bytes (no SASS to count spills) 8 > max_spill_bytes 0",
    )
    store = RegistryStore.open(db, read_only=True)
    try:
        assert plan_of(spec, store).counts()["rejected"] == 1
        assert plan_of(spec, store, retry_failed=True).counts()["new"] == 1
    finally:
        store.close()


# --- 2. compile children that cannot start ---------------------------------------------------

FAILING_START = (
    "from b12x_aot.compiler import _child\n"
    "def prepare(arch, scratch):\n"
    "    raise ImportError('libcuda.so.1: cannot open shared object file')\n"
    "_child.prepare_worker = prepare\n"
    "_child.main()\n"
)
# Fails to start once (a marker file remembers), then compiles every job as a fixed outcome.
FLAKY_START = (
    "import os, sys\n"
    "from b12x_aot.compiler import _child\n"
    "from b12x_aot.compiler._driver import CompileOutcome\n"
    "from b12x_aot.compiler._status import Status\n"
    "marker = os.path.join(sys.argv[2], 'started-once')\n"
    "def prepare(arch, scratch):\n"
    "    if not os.path.exists(marker):\n"
    "        open(marker, 'w').close()\n"
    "        raise RuntimeError('first start fails')\n"
    "_child.prepare_worker = prepare\n"
    "_child.compile_job = lambda job: CompileOutcome(job.variant, Status.FAILED, 'compile', 'fake', '', 0.0)\n"
    "_child.main()\n"
)


def jobs_of(tmp_path: Path) -> list[CompileJob]:
    spec = write_spec(tmp_path, "s.yaml", ONE_ARCH)
    return [CompileJob.of(item.variant) for item in plan_of(spec).to_compile()]


def run_pool(jobs: Sequence[CompileJob], workers: int) -> list[CompileOutcome]:
    outcomes: list[CompileOutcome] = []
    _pool.LocalExecutor(workers).run_jobs(jobs, outcomes.append, timeout=60)
    return outcomes


def test_children_that_never_start_end_jobs_as_transient_with_the_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_child, "_BOOT", FAILING_START)
    started: list[str] = []
    real = _pool.CompileChild
    monkeypatch.setattr(
        _pool, "CompileChild", lambda arch, scratch: started.append(arch) or real(arch, scratch)
    )
    jobs = jobs_of(tmp_path)
    outcomes = run_pool(jobs, workers=2)
    assert sorted(o.variant.key for o in outcomes) == sorted(j.variant.key for j in jobs)
    # Bounded: no new child after START_ATTEMPTS failures (one already starting may add one).
    assert _pool.START_ATTEMPTS <= len(started) <= _pool.START_ATTEMPTS + 1
    for outcome in outcomes:
        assert (outcome.status, outcome.stage) == (Status.TRANSIENT, "worker")
        assert "failed to start: ImportError: libcuda.so.1" in outcome.reason
        assert f"({len(started)} attempts)" in outcome.reason
        assert "Traceback (most recent call last)" in outcome.log and "def prepare" not in outcome.log


def test_one_child_failing_to_start_fails_no_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_child, "_BOOT", FLAKY_START)
    jobs = jobs_of(tmp_path)
    outcomes = run_pool(jobs, workers=1)
    assert len(outcomes) == len(jobs)
    assert {(o.status, o.stage, o.reason) for o in outcomes} == {("failed", "compile", "fake")}


def test_a_transient_failure_is_planned_again(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "s.yaml", ONE_VARIANT)
    db = tmp_path / "r.db"
    record(db, plan_of(spec), Status.TRANSIENT, "worker", "compile worker for sm_90a failed to start")
    store = RegistryStore.open(db, read_only=True)
    try:
        counts = plan_of(spec, store).counts()
        assert counts["new"] == 1 and counts["failed"] == 0
    finally:
        store.close()


# --- 3. dry runs write nothing ---------------------------------------------------------------


def test_dry_run_leaves_the_registry_untouched_and_expands_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, "s.yaml", ONE_VARIANT)
    db = tmp_path / "r.db"
    record(db, plan_of(spec), Status.FAILED, "compile", "broken")
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    before = db.read_bytes()
    monkeypatch.setenv("HOME", str(tmp_path))
    result = compile_cli(str(spec), "--registry", "~/r.db", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["counts"]["failed"] == 1  # it read ~/r.db
    assert db.read_bytes() == before  # not switched to WAL, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.db", "s.yaml"]
    result = compile_cli(str(spec), "--registry", "~/none.db", "--dry-run", "--json")
    assert result.exit_code == 0 and not (tmp_path / "none.db").exists()


def test_a_dry_run_that_constraints_empty_names_the_constraints(tmp_path: Path) -> None:
    # --where picks combinations a constraint prunes: no variant is left, and the plan says
    # which constraint took how many, instead of an empty table.
    spec = write_spec(
        tmp_path, "s.yaml", ONE_ARCH.replace("cta_threads: [128, 256]", "cta_threads: [128, 256, 512]")
    )
    args = (str(spec), "--registry", str(tmp_path / "r.db"), "--dry-run", "--where", "cta_threads=512")
    result = compile_cli(*args)
    assert result.exit_code == 0, result.output
    assert "every combination was pruned by a spec constraint" in result.stderr  # a title: stderr
    pruned = result.stdout.splitlines()[-1].split("\t")  # piped: one line per row, nothing folded
    assert pruned == ["moe.topk_sum", "sm_90a", "2", "constraint 'hidden % (cta_threads * 8) == 0' is false"]
    plan = json.loads(compile_cli(*args, "--json").stdout)
    assert plan["variants"] == [] and plan["counts"]["pruned"] == 2  # fp32 and bf16 output
    assert [(p["arch"], p["count"]) for p in plan["pruned"]] == [("sm_90a", 2)]


# --- 4. the registry failing mid-build -------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (
            OperationalError("INSERT", {}, Exception("server closed the connection unexpectedly")),
            3,
            "OperationalError with registry",
        ),
        (
            OSError(28, "No space left on device", "/blobs/ab/abcd"),
            3,
            "No space left on device (/blobs/ab/abcd)",
        ),
        (RegistryError("the registry went away"), 3, "the registry went away"),
        (BlobDirError("blob directory belongs to another registry"), 2, "belongs to another registry"),
    ],
)
def test_a_registry_error_mid_build_is_one_line_and_marks_the_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception, code: int, message: str
) -> None:
    def fail(self: RegistryWriter, build_id: int, rec: FailureRecord) -> None:
        raise error

    monkeypatch.setattr(cli, "executor_from", lambda text, jobs: FakeExecutor([]))
    monkeypatch.setattr(RegistryWriter, "record_failure", fail)
    spec = write_spec(tmp_path, "s.yaml", NO_LIMITS)
    db = tmp_path / "r.db"
    result = compile_cli(str(spec), "--registry", str(db), "--json")
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0]
    assert json.loads(result.stdout) == {"ok": False, "error": errors[0][len("error: ") :], "exit_code": code}
    assert build_rows(db) == ["interrupted"]
    assert "3  the registry or the filesystem failed" in compile_cli("--help").stdout


# --- 5, 6. SIGTERM and Ctrl-C ----------------------------------------------------------------

# Children that never become ready: the build waits on them until the signal comes. Each
# marks its start in the scratch directory, so the signal lands once one is in the pool.
STALLED = (
    "from b12x_aot.compiler import _child\n"
    "_child._BOOT = 'import pathlib, sys, time; pathlib.Path(sys.argv[2], \"up\").touch(); time.sleep(600)'\n"
)


def started(db: Path) -> bool:
    """Whether the build is under way: its row is written (the file may exist before its tables)."""
    try:
        return db.exists() and build_rows(db) == ["running"]
    except sqlite3.OperationalError:
        return False


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_cleans_up_and_exits_with_its_code(tmp_path: Path, signum: int, code: int) -> None:
    spec = write_spec(tmp_path, "s.yaml", NO_LIMITS)
    db = tmp_path / "r.db"
    temp = tmp_path / "temp"
    temp.mkdir()
    args = [str(spec), "--registry", str(db), "-j", "1"]
    # Python keeps an inherited SIG_IGN for SIGINT (a test run started in the background has
    # one): give the build the handler an interactive shell's Ctrl-C would find.
    script = (
        f"import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n{STALLED}"
        f"from b12x_aot.compiler import cli\ncli.main({args!r})\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(temp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (started(db) and list(temp.glob("*/up"))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=60)
        time.sleep(0.2)
    time.sleep(0.5)  # past the child's registration in the pool
    proc.send_signal(signum)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr and "Aborted!" not in stderr
    assert "rerun the same command to resume" in stderr
    assert build_rows(db) == ["interrupted"]
    assert list(temp.iterdir()) == []  # the pool's scratch directory is gone


def test_a_child_whose_parent_closed_the_pipe_exits_quietly(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    boot = (
        "import time\n"
        "from b12x_aot.compiler import _child\n"
        "_child.prepare_worker = lambda arch, scratch: None\n"
        "_child.compile_job = lambda job: time.sleep(1) or job\n"
        "_child.main()\n"
    )
    monkeypatch.setattr(_child, "_BOOT", boot)
    child = _child.CompileChild("sm_90a", str(tmp_path))
    while not child.ready:
        child.update(bool(wait([child], 1.0)), None)
        assert not child.gone
    child.send("job")  # type: ignore[arg-type]
    child._conn.close()  # the parent goes away mid-compile: the answer has nowhere to go
    assert child._process.wait(timeout=30) != 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err


# --- 7, 8. bad --shard and --arch ------------------------------------------------------------


@pytest.mark.parametrize("shard", ["", "1", "a/b", "1/3/4"])
def test_a_malformed_shard_is_refused(tmp_path: Path, shard: str) -> None:
    spec = write_spec(tmp_path, "s.yaml", ONE_ARCH)
    result = compile_cli(str(spec), "--registry", str(tmp_path / "r.db"), "--shard", shard, "--dry-run")
    assert result.exit_code == 2
    assert "--shard" in result.stderr


def test_an_arch_no_spec_lists_is_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "s.yaml", ONE_ARCH)
    result = compile_cli(str(spec), "--registry", str(tmp_path / "r.db"), "--arch", "sm_100a", "--dry-run")
    assert result.exit_code == 2
    assert "no spec lists --arch sm_100a; the specs list sm_90a" in result.stderr
    both = compile_cli(
        str(spec), "--registry", str(tmp_path / "r.db"), "--arch", "sm_100a", "--arch", "sm_90a", "--dry-run"
    )
    assert both.exit_code == 0 and "warning: no spec lists --arch sm_100a" in both.stderr


def test_timeout_help_says_a_timeout_is_retried() -> None:
    text = " ".join(compile_cli("--help").stdout.split())
    assert "recorded as timeout, which the next build retries" in text
