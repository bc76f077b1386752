"""The example kernels build offline for every arch, and what the registry records of their launch:
the words their host functions derive, the geometry the DSL chose, and every check of the spec
against it (grid, block, shared memory), with faults reported in the user's terms."""

from __future__ import annotations

import json
import re
import sqlite3
import struct
import textwrap
from pathlib import Path

import pytest

from b12x_aot.contract import TensorMap
from b12x_aot.loader import LaunchArgumentError, PreparedLaunch, Registry, TensorView

from ..conftest import registry_cli, run_compile, write_spec
from .conftest import EXAMPLES, examples_env

pytest.importorskip("cutlass", reason="building the examples needs the CuTe DSL")
pytestmark = pytest.mark.dsl

ELEMENTWISE = (EXAMPLES / "specs" / "elementwise.yaml").read_text()
GEMM = (EXAMPLES / "specs" / "tensorop_gemm.yaml").read_text()
ONE_ELEMENTWISE = ["--where", "dtype=fp32", "--where", "op=add", "--where", "threads=128"]
ONE_GEMM = ["--where", "ab=fp16", "--where", "out=fp32", "--where", "tile_m=64"]
ONE_TMA_GEMM = ["--where", "ab=fp16", "--where", "out=fp16"]


@pytest.fixture(scope="module")
def examples_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One elementwise variant for each of the three archs, one GEMM and one TMA GEMM for sm_90a."""
    db = tmp_path_factory.mktemp("examples") / "examples.db"
    env = examples_env()
    run_compile(
        str(EXAMPLES / "specs" / "elementwise.yaml"), "--registry", str(db), *ONE_ELEMENTWISE, env=env
    )
    run_compile(
        str(EXAMPLES / "specs" / "tensorop_gemm.yaml"),
        "--registry",
        str(db),
        "--arch",
        "sm_90a",
        *ONE_GEMM,
        env=env,
    )
    run_compile(str(EXAMPLES / "specs" / "hopper_gemm.yaml"), "--registry", str(db), *ONE_TMA_GEMM, env=env)
    return db


def _launches(db: Path) -> dict[tuple[str, str], dict]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT v.family, v.arch, k.launch_json FROM current_variants c "
            "JOIN variants v ON v.id = c.variant_id JOIN kernels k ON k.variant_id = v.id"
        ).fetchall()
    return {(f, a): json.loads(text) for f, a, text in rows}


def test_what_the_registry_records_of_the_host_launch(examples_db: Path) -> None:
    launches = _launches(examples_db)
    assert {a for f, a in launches if f == "examples.elementwise"} == {"sm_90a", "sm_100a", "sm_120a"}
    ew = launches[("examples.elementwise", "sm_90a")]
    assert ew["block"] == [128, 1, 1] and ew["smem"] == 0  # the kernel's own launch
    # tiled views the host function computed: (pointer, tiles of m and n, strides, tile strides)
    words = [w[2] for w in ew["params"][0][2]]
    assert words == [
        "a",
        "cdiv(m, 4)",
        "cdiv(n, 128)",
        "a__stride0",
        "a__stride1",
        "(a__stride0 * 4)",
        "(a__stride1 * 128)",
    ]
    gemm = launches[("examples.tensorop_gemm", "sm_90a")]
    assert gemm["smem"] == 3 * (64 + 128) * 32 * 2  # its Storage struct, sized by the DSL
    assert "params" not in gemm  # the tensors go to the kernel as given


def test_prepared_launch_packs_the_derived_words(examples_db: Path, driver) -> None:
    torch = pytest.importorskip("torch")
    with Registry.open(examples_db) as registry:
        entry = registry.resolve(
            "examples.elementwise", 1, arch="sm_90a", dtype="fp32", op="add", threads=128
        )
        launch = PreparedLaunch(entry, 0, None, 0)
        a, b = torch.zeros(37, 300), torch.zeros(300, 37).t()
        c = torch.zeros(37, 310)[:, 5:305]
        launch(a, b, c)
        grid, block, smem, _, _ = driver.calls[-1]
        assert grid == (-(-37 // 4) * -(-300 // 128), 1, 1) and block == (128, 1, 1) and smem == 0
        raw = struct.unpack_from(launch.layout.fmt, driver.params(launch.layout))
        assert raw[:7] == (a.data_ptr(), 10, 3, 300, 1, 1200, 128)
        assert raw[7:14] == (b.data_ptr(), 10, 3, 1, 37, 4, 4736)
        assert raw[14:21] == (c.data_ptr(), 10, 3, 310, 1, 1240, 128) and raw[21:] == (10, 3, 37, 300)


def test_the_tma_gemm_records_its_tensor_maps(examples_db: Path, driver, cluster_driver, encoder) -> None:
    launch_json = _launches(examples_db)[("examples.hopper_gemm", "sm_90a")]
    assert launch_json["block"] == [288, 1, 1] and launch_json["cluster"] == [2, 1, 1]
    maps = [TensorMap.from_json(p[3]) for p in launch_json["params"] if len(p) > 3]
    # fp16, dims innermost first, byte strides; the 128-byte swizzle spans 64 elements, and B's
    # 128-row tile is split between the cluster's two CTAs (each loads and multicasts half)
    assert maps == [
        TensorMap("a", 6, ("k", "m"), ("lda * 2",), (64, 128), (1, 1), 0, 3, 2, 0),
        TensorMap("b", 6, ("b__shape1", "n"), ("ldb * 2",), (64, 64), (1, 1), 0, 3, 2, 0),
        TensorMap("c", 6, ("c__shape1", "c__shape0"), ("ldc * 2",), (64, 128), (1, 1), 0, 3, 2, 0),
    ]
    companions = [[w[2] for w in p[2]] for p in launch_json["params"] if len(p) == 3]
    assert companions == [["m", "k"], ["n", "b__shape1"], ["c__shape0", "c__shape1"]]
    with Registry.open(examples_db) as registry:
        entry = registry.resolve(
            "examples.hopper_gemm", 1, arch="sm_90a", ab="fp16", out="fp16", tile_n=128, stages=4
        )
        launch = PreparedLaunch(entry, 0, None, 0)
        assert launch.layout.offsets == (48, 176, 240, 368, 432, 560)  # the cubin's own table
        a, b, c = (
            TensorView(1 << 20, (300, 520), (528, 1)),
            TensorView(1 << 24, (264, 520), (520, 1)),
            TensorView(1 << 28, (300, 264), (272, 1)),
        )
        launch.checked(a, b, c)
        assert [call[2:5] for call in encoder.calls] == [
            (1 << 20, [520, 300], [1056]),
            (1 << 24, [520, 264], [1040]),
            (1 << 28, [264, 300], [544]),
        ]
        assert cluster_driver.calls[-1][0] == (4, 3, 1) and cluster_driver.calls[-1][4] == (2, 1, 1)


def test_checked_holds_tensors_to_their_layout(examples_db: Path, driver) -> None:
    with Registry.open(examples_db) as registry:
        entry = registry.resolve(
            "examples.tensorop_gemm", 1, arch="sm_90a", ab="fp16", out="fp32", tile_m=64, tile_n=128, stages=3
        )
        launch = PreparedLaunch(entry, 0, None, 0)
        a, b, c = (
            TensorView(1 << 20, (64, 64), (72, 1)),
            TensorView(1 << 21, (128, 64), (64, 1)),
            TensorView(1 << 22, (64, 128), (128, 1)),
        )
        launch.checked(a, b, c)
        assert driver.calls[-1][0] == (1, 1, 1)
        cases = [
            ((TensorView(1 << 20, (64, 64), (72, 2)), b, c), "argument 'a' mode 1 must have stride 1"),
            ((TensorView(1 << 20, (64, 60), (72, 1)), b, c), "'k' must be a multiple of 8"),
            ((TensorView(1 << 20, (64, 64), (70, 1)), b, c), "'lda' must be a multiple of 8"),
            (
                (a, TensorView(1 << 21, (128, 56), (64, 1)), c),
                "argument 'b' mode 1 must have extent 64 (the spec's 'k')",
            ),
            ((a, b, TensorView((1 << 22) + 8, (64, 128), (128, 1))), "argument 'c' must be 16-byte aligned"),
            ((a, b, TensorView(1 << 22, (64, 128, 1), (128, 1, 1))), "argument 'c' must have 2 modes"),
            (
                (a, b, TensorView(1 << 22, (1 << 31, 128), (128, 1))),
                "mode 0 extent must be in [0, 2147483647]",
            ),
            ((a, b, "c"), "must be a tensor (torch) or a TensorView"),
        ]
        for args, fragment in cases:
            with pytest.raises(LaunchArgumentError, match=re.escape(fragment)):
                launch.checked(*args)
        assert entry.shapes(m=64, n=128, k=64, lda=64, ldb=64, ldc=128) == {
            "a": (64, 64),
            "b": (128, 64),
            "c": (64, 128),
        }


def _failures(tmp_path: Path, spec: Path, args: list[str], env: dict) -> list[dict]:
    """Build ``spec`` for sm_90a; the failed variants its summary lists."""
    registry = str(tmp_path / "r.db")
    proc = run_compile(
        str(spec), "--registry", registry, "--arch", "sm_90a", *args, "--json", check=False, env=env
    )
    assert proc.returncode == 1, proc.stderr
    return json.loads(proc.stdout)["failed"]


def _broken(tmp_path: Path, old: str, new: str, base: str = GEMM) -> dict:
    assert old in base
    spec = write_spec(tmp_path, "s.yaml", base.replace(old, new))
    (failure,) = _failures(tmp_path, spec, ONE_GEMM if base is GEMM else ONE_ELEMENTWISE, examples_env())
    return failure


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        (
            "launch:  ",
            "launch:\n  smem: 1024\n ",
            "the spec's dynamic shared memory is 1024 B; the kernel's host function launches with 36864 B",
        ),
        (
            "launch:  ",
            "launch:\n  block: [256, 1, 1]\n ",
            "the spec's block is (256, 1, 1); the kernel's host function launches (128, 1, 1)",
        ),
        ('grid: ["cdiv(m, tile_m)"', 'grid: ["cdiv(m, 128)"', "the spec's grid"),
    ],
)
def test_a_spec_that_disagrees_with_the_kernel_fails_its_variant(
    tmp_path: Path, old: str, new: str, fragment: str
) -> None:
    failure = _broken(tmp_path, old, new)
    assert failure["stage"] == "contract" and fragment in failure["reason"], failure["reason"]


def test_a_launch_short_of_the_kernels_storage_fails(tmp_path: Path) -> None:
    package = tmp_path / "shortpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    source = (EXAMPLES / "dsl_examples" / "tensorop_gemm.py").read_text()
    launch = "block=[self.threads, 1, 1], stream=stream"
    assert launch in source
    (package / "gemm.py").write_text(
        source.replace(launch, "block=[self.threads, 1, 1], smem=1024, stream=stream")
    )
    spec = write_spec(tmp_path, "s.yaml", GEMM.replace("dsl_examples.tensorop_gemm:", "shortpkg.gemm:"))
    env = examples_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    (failure,) = _failures(tmp_path, spec, ONE_GEMM, env)
    assert (
        "the kernel's shared storage takes 36864 B, but its host function launches it with 1024 B"
        in failure["reason"]
    )


def test_dsl_errors_are_stored_without_colour_and_whole_in_the_log(tmp_path: Path) -> None:
    package = tmp_path / "badpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "k.py").write_text(
        textwrap.dedent("""
        import cutlass.cute as cute

        @cute.kernel
        def body(t: cute.Tensor):
            t[0] = t[0] + undefined_name

        @cute.jit
        def host(t: cute.Tensor):
            body(t).launch(grid=[1, 1, 1], block=[32, 1, 1])
    """)
    )
    spec = write_spec(
        tmp_path,
        "s.yaml",
        """
        family: t.bad
        abi: 1
        kernel: badpkg.k:host
        archs: [sm_90a]
        params: {x: [1]}
        args:
          - {name: t, kind: tensor, dtype: fp32, shape: [n]}
    """,
    )
    env = examples_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    db = tmp_path / "r.db"
    proc = run_compile(str(spec), "--registry", str(db), "--json", check=False, env=env)
    (failure,) = json.loads(proc.stdout)["failed"]
    assert "\x1b" not in failure["reason"] and "undefined_name" in failure["reason"]
    log = registry_cli("failures", "-r", str(db), "--log", failure["key"][:12]).stdout
    assert "\x1b" not in log and len(log.splitlines()) > len(failure["reason"].splitlines())


@pytest.mark.parametrize(
    ("kernel", "fragment"),
    [
        ("dsl_examples.elementwise:nothing", "module dsl_examples.elementwise has no 'nothing'"),
        ("dsl_examples.tensorop_gemm:math", "is a module, not"),
        ("nosuchpkg.mod:Kernel", "kernel module 'nosuchpkg.mod' cannot be found"),
    ],
)
def test_an_entry_that_cannot_serve_is_refused_once_at_planning(
    tmp_path: Path, kernel: str, fragment: str
) -> None:
    spec = write_spec(
        tmp_path, "s.yaml", ELEMENTWISE.replace("dsl_examples.elementwise:ElementwiseBinary", kernel)
    )
    proc = run_compile(str(spec), "--registry", str(tmp_path / "r.db"), check=False, env=examples_env())
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr


def test_a_defaulted_parameter_before_the_stream_needs_a_spec_argument(tmp_path: Path) -> None:
    package = tmp_path / "streampkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "k.py").write_text(
        textwrap.dedent("""
            import cuda.bindings.driver as cuda
            import cutlass
            import cutlass.cute as cute

            @cute.jit
            def host(t: cute.Tensor, n: cutlass.Int32 = 4, stream: cuda.CUstream = None):
                pass
        """)
    )
    spec = write_spec(
        tmp_path,
        "s.yaml",
        """
        family: t.stream
        abi: 1
        kernel: streampkg.k:host
        archs: [sm_90a]
        params: {x: [1]}
        args:
          - {name: t, kind: tensor, dtype: fp32, shape: [m]}
        """,
    )
    env = examples_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    proc = run_compile(str(spec), "--registry", str(tmp_path / "r.db"), check=False, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "parameter 'n' of streampkg.k:host comes before its stream parameter" in proc.stderr
