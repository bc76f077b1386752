"""comm.allreduce_rmsnorm without a GPU: the spec's variants fit the window, the runtime's
choice of variant and row limit, and the communicator's argument checks and launch arguments
(a fake launch records them)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from b12x_aot.comm import CapacityError, CommArgumentError
from b12x_aot.comm._fused import FusedLaunch, FusedVariant, built_fused, choose_fused
from b12x_aot.comm._policy import ABI
from b12x_aot.comm.layout import MAX_BLOCKS, MAX_WORLD
from b12x_aot.compiler import expand, load_spec

from ..conftest import SPECS, run_compile
from .fake_communicator import VA, FakeLaunch, make

torch = pytest.importorskip("torch")


def test_spec_variants_fit_the_layout_and_use_every_thread() -> None:
    spec = load_spec(SPECS / "comm_allreduce_rmsnorm.yaml")
    assert spec.abi == ABI  # the same window layout as comm.allreduce
    accepted = [v.id.params for v in expand(spec).accepted]
    assert {p["world"] for p in accepted} == {2, 4, 8, 9}
    assert {p["hidden"] for p in accepted} == {2048, 3584, 4096, 7168}
    assert len(accepted) == 3 * 2 * 4 * 4 * 2  # archs x dtypes x hiddens x worlds x packs
    for p in accepted:
        threads = p["hidden"] // (8 * p["packs_per_thread"])
        assert threads * 8 * p["packs_per_thread"] == p["hidden"] and threads % 32 == 0 and threads <= 1024
        assert p["world"] <= MAX_WORLD and threads >= p["world"]


def test_dry_run_plans_every_variant(tmp_path) -> None:
    proc = run_compile(
        str(SPECS / "comm_allreduce_rmsnorm.yaml"),
        "--registry",
        str(tmp_path / "k.db"),
        "--dry-run",
        "--json",
    )
    plan = json.loads(proc.stdout)
    assert plan["counts"]["new"] == 192 and plan["counts"]["rejected"] == 0, plan["counts"]
    assert {v["family"] for v in plan["variants"]} == {"comm.allreduce_rmsnorm"}


def test_built_fused_keeps_this_world_and_dtypes() -> None:
    built = [
        {"dtype": "bf16", "hidden": 4096, "world": 4, "packs_per_thread": 2},
        {"dtype": "bf16", "hidden": 4096, "world": 4, "packs_per_thread": 1},
        {"dtype": "fp16", "hidden": 4096, "world": 4, "packs_per_thread": 1},
        {"dtype": "bf16", "hidden": 4096, "world": 2, "packs_per_thread": 1},
        {"dtype": "bf16", "world": 4},  # another shape of the family: ignored
    ]
    assert built_fused(built, world=4, dtypes=("bf16",)) == [
        FusedVariant("bf16", 4096, 1),
        FusedVariant("bf16", 4096, 2),
    ]


def test_choose_fused_takes_the_variant_that_fits_most_rows() -> None:
    wide, narrow = FusedVariant("bf16", 7168, 1), FusedVariant("bf16", 7168, 2)
    launches: dict[Any, Any] = {wide: "wide", narrow: "narrow"}
    per_sm = {wide: 2, narrow: 4}
    # One rank per GPU: both fit the 64 flag rows; the wider CTA wins the tie.
    assert choose_fused(launches, per_sm, 132, 1) == {("bf16", 7168): FusedLaunch(wide, "wide", MAX_BLOCKS)}
    # Nine virtual ranks: 2 * 132 // 9 = 29 rows against 4 * 132 // 9 = 58.
    assert choose_fused(launches, per_sm, 132, 9) == {("bf16", 7168): FusedLaunch(narrow, "narrow", 58)}
    assert choose_fused(launches, {wide: 0, narrow: 0}, 132, 9) == {}  # nothing fits: no launch


class FakeTensor:
    """The parts of a CUDA tensor the communicator reads."""

    def __init__(self, shape, dtype=torch.bfloat16, ptr=0x10000, *, device=0, contiguous=True) -> None:
        self.shape, self.dtype, self.ptr, self.contiguous = tuple(shape), dtype, ptr, contiguous
        self.device = SimpleNamespace(type="cuda", index=device)

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self) -> int:
        return 2

    def data_ptr(self) -> int:
        return self.ptr

    def is_contiguous(self) -> bool:
        return self.contiguous

    def stride(self) -> tuple[int, ...]:
        return (1,)


H = 4096
MB = 1 << 20


def fused_comm(max_rows: int = 32, capacity: int = 1 << 20):
    comm, _, _, _ = make(capacity=capacity)
    launch = FakeLaunch(("bf16", "fused", ""))
    comm._fused = {("bf16", H): FusedLaunch(FusedVariant("bf16", H, 1), launch, max_rows)}
    return comm, launch


def tensors(rows: int = 8, **kw: Any) -> dict[str, Any]:
    made = {
        "inp": FakeTensor((rows, H), ptr=1 * MB),
        "residual": FakeTensor((rows, H), ptr=2 * MB),
        "gamma": FakeTensor((H,), ptr=3 * MB),
        "out": FakeTensor((rows, H), ptr=4 * MB),
        "residual_out": FakeTensor((rows, H), ptr=5 * MB),
    }
    made.update(kw)
    return made


def call(comm, t: dict[str, Any], eps: Any = 1e-6):
    return comm.all_reduce_rmsnorm(
        t["inp"], t["residual"], t["gamma"], eps, out=t["out"], residual_out=t["residual_out"]
    )


def test_launches_with_the_spec_argument_order() -> None:
    comm, launch = fused_comm()
    t = tensors()
    assert call(comm, t) == (t["out"], t["residual_out"])
    (args,) = launch.calls
    capacity = (1 << 20) // 2
    assert args == (4 * MB, 5 * MB, 1 * MB, 2 * MB, 3 * MB, VA + 64, VA, 1, 8, capacity, 1e-6, None)


def test_outputs_may_be_the_inputs_themselves() -> None:
    comm, launch = fused_comm()
    t = tensors()
    call(comm, {**t, "out": t["inp"], "residual_out": t["residual"]})
    assert launch.calls[0][:4] == (1 * MB, 2 * MB, 1 * MB, 2 * MB)


def test_zero_rows_launch_nothing() -> None:
    comm, launch = fused_comm()
    call(comm, tensors(rows=0))
    assert not launch.calls


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"residual": FakeTensor((8, H), torch.float16, 2 * MB)}, "residual must have inp's dtype"),
        ({"residual": FakeTensor((4, H), ptr=2 * MB)}, r"residual must have shape \(8, 4096\)"),
        ({"gamma": FakeTensor((H, 1), ptr=3 * MB)}, r"gamma must have shape \(4096,\)"),
        ({"out": FakeTensor((8, H), ptr=4 * MB, device=1)}, "out must be on inp's device"),
        ({"inp": FakeTensor((8, H), ptr=1 * MB, contiguous=False)}, "inp must be contiguous"),
        ({"gamma": FakeTensor((H,), ptr=3 * MB + 8)}, "gamma must be 16-byte aligned"),
        ({"out": FakeTensor((8, H), ptr=1 * MB + 16)}, "out must be inp or residual itself"),
        ({"residual_out": FakeTensor((8, H), ptr=4 * MB)}, "it overlaps out"),
        ({"out": FakeTensor((8, H), ptr=3 * MB)}, "it overlaps gamma"),
    ],
)
def test_bad_operands_are_refused(change: dict, problem: str) -> None:
    comm, launch = fused_comm()
    with pytest.raises(CommArgumentError, match=problem):
        call(comm, tensors(**change))
    assert not launch.calls


def test_rows_hidden_capacity_and_eps_are_checked() -> None:
    comm, launch = fused_comm(max_rows=16)
    with pytest.raises(CommArgumentError, match="rows must be at most 16"):
        call(comm, tensors(rows=17))
    with pytest.raises(CommArgumentError, match=r"no comm\.allreduce_rmsnorm variant for bf16"):
        g = FakeTensor((2048,), ptr=3 * MB)
        call(comm, {"inp": FakeTensor((8, 2048), ptr=MB), "residual": FakeTensor((8, 2048), ptr=2 * MB),
                    "gamma": g, "out": FakeTensor((8, 2048), ptr=4 * MB),
                    "residual_out": FakeTensor((8, 2048), ptr=5 * MB)})  # fmt: skip
    for eps in (-1.0, float("nan"), True, "1e-6"):
        with pytest.raises(CommArgumentError, match="eps must be a finite number"):
            call(comm, tensors(), eps=eps)
    small, small_launch = fused_comm(capacity=8 * H * 2)
    call(small, tensors(rows=8))  # exactly the capacity
    with pytest.raises(CapacityError):
        call(small, tensors(rows=9))
    assert not launch.calls and len(small_launch.calls) == 1
