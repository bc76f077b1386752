"""Checked launches refuse every wrong argument before the driver sees it (no GPU: the driver
seam records launches instead).

For one variant of every bundled family: each single fault (dtype, device, layout, size, raw
address, alignment, scalar kind and range, a broken launch requirement such as a negative
token count, argument count) raises ``LaunchArgumentError`` and launches nothing; the
documented size rules (larger leading dimension, flat buffer, ``Buffer``) launch; and random
calls either raise or launch with every buffer at least as large as the spec's shape needs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from b12x_aot.compiler import expand, load_spec
from b12x_aot.contract import DTYPES, canonical_json
from b12x_aot.loader import Buffer, IndexEntry, LaunchArgumentError, PreparedLaunch, UncheckedSizeWarning

from ..conftest import SPECS
from .conftest import RecordingClusterDriver, RecordingDriver

torch = pytest.importorskip("torch")

# family spec -> (params that pick one variant, scalars of a good call)
FAMILIES: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    "moe_topk_sum.yaml": ({"element": "bf16", "output": "fp32", "topk": 8, "hidden": 7168}, {}),
    "quant_mxfp8.yaml": ({"dtype": "fp16", "K": 2048, "rounding": "floor"}, {}),
    "moe_route_pack.yaml": ({"block_m": 16}, {}),
    "moe_w4a16.yaml": (
        {
            **{"element": "bf16", "output": "bf16", "n": 2048, "k": 7168, "block_m": 16},
            **{"split_k": 1, "k_ctas": 1, "w_copy": "cp_async"},
        },
        {},
    ),
    "comm_allreduce.yaml": ({"dtype": "bf16", "world": 4, "algorithm": "twoshot", "transport": "push"}, {}),
}
SCALARS = {"num_tokens": 5, "num_experts": 64, "num_rows": 3, "rank": 1, "num_elements": 64, "capacity": 1024}


class FakeTensor:
    """What checked() reads of a torch tensor, without a GPU."""

    def __init__(
        self, shape: tuple[int, ...], dtype: Any, *, device: int = 0, address: int = 1 << 32
    ) -> None:
        self.shape, self.dtype, self.device_index, self.address = tuple(shape), dtype, device, address
        self.contiguous = True

    def get_device(self) -> int:
        return self.device_index

    @property
    def device(self) -> str:
        return f"cuda:{self.device_index}" if self.device_index >= 0 else "cpu"

    def is_contiguous(self) -> bool:
        return self.contiguous

    def stride(self) -> tuple[int, ...]:
        return tuple(
            math.prod(self.shape[i + 1 :]) * (1 if self.contiguous else 2) for i in range(len(self.shape))
        )

    def data_ptr(self) -> int:
        return self.address

    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def entry_for(spec_file: str, pick: dict[str, Any], arch: str = "sm_90a") -> IndexEntry:
    """The index entry a registry would hold for this variant, straight from its spec."""
    spec = load_spec(SPECS / spec_file)
    accepted = expand(spec, archs=[arch]).accepted
    v = next(v for v in accepted if all(v.id.params[k] == val for k, val in pick.items()))
    row = (
        v.key,
        spec.family,
        spec.abi,
        arch,
        canonical_json(v.id.params),
        "0" * 64,
        "kernel",
        canonical_json([a.to_json() for a in v.args]),
        canonical_json(spec.geometry.to_json()),
        str(spec.path),
    )
    return IndexEntry(row)


def good_call(launch: PreparedLaunch, **scalars: int) -> list[Any]:
    """A valid argument list: tensors of exactly the declared shapes, scalars as given."""
    values = {**SCALARS, **scalars}
    shapes = launch.shapes(**{a.name: values[a.name] for a in launch.args if not a.is_pointer})
    out: list[Any] = []
    for i, arg in enumerate(launch.args):
        if arg.is_pointer:
            dtype = getattr(torch, DTYPES[arg.dtype].torch_name)
            out.append(FakeTensor(shapes[arg.name], dtype, address=(i + 1) << 32))
        else:
            out.append(values[arg.name])
    return out


@pytest.fixture(params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, driver: RecordingDriver) -> tuple[PreparedLaunch, RecordingDriver]:
    pick, _ = FAMILIES[request.param]
    return PreparedLaunch(entry_for(request.param, pick), 0, None, 7), driver


def _faults(launch: PreparedLaunch) -> list[tuple[str, Callable[[list[Any]], None]]]:
    """Every single-argument fault to try, as (what, how to apply it to a good call)."""
    faults: list[tuple[str, Callable[[list[Any]], None]]] = []
    for i, arg in enumerate(launch.args):
        if not arg.is_pointer:
            faults += [
                (f"{arg.name} too large", lambda a, i=i: a.__setitem__(i, 2**31)),
                (f"{arg.name} float", lambda a, i=i: a.__setitem__(i, 1.0)),
                (f"{arg.name} bool", lambda a, i=i: a.__setitem__(i, True)),
            ]
            continue

        def mutate(fn: Callable[[FakeTensor], None], i: int = i) -> Callable[[list[Any]], None]:
            return lambda a: fn(a[i])

        wrong = torch.float64 if arg.dtype != "fp64" else torch.float32
        faults += [
            (f"{arg.name} dtype", mutate(lambda t, w=wrong: setattr(t, "dtype", w))),
            (f"{arg.name} other gpu", mutate(lambda t: setattr(t, "device_index", 1))),
            (f"{arg.name} on the cpu", mutate(lambda t: setattr(t, "device_index", -1))),
            (f"{arg.name} strided", mutate(lambda t: setattr(t, "contiguous", False))),
            (f"{arg.name} raw int", lambda a, i=i: a.__setitem__(i, a[i].address)),
            (f"{arg.name} not a pointer", lambda a, i=i: a.__setitem__(i, "0x1000")),
            (
                f"{arg.name} Buffer one byte short",
                lambda a, i=i: a.__setitem__(i, Buffer(a[i].address, a[i].nbytes() - 1)),
            ),
        ]
        if arg.align > DTYPES[arg.dtype].itemsize:
            step = DTYPES[arg.dtype].itemsize
            faults.append(
                (f"{arg.name} misaligned", mutate(lambda t, s=step: setattr(t, "address", t.address + s)))
            )
        for d in range(len(arg.shape or ())):
            faults.append(
                (f"{arg.name} dim {d} short", mutate(lambda t, d=d: setattr(t, "shape", _shrink(t.shape, d))))
            )
        faults.append((f"{arg.name} extra dim", mutate(lambda t: setattr(t, "shape", (*t.shape, 1, 2)))))
    for name in ("num_tokens", "num_rows", "num_elements", "rank"):
        if any(a.name == name for a in launch.args):
            index = next(i for i, a in enumerate(launch.args) if a.name == name)
            faults.append((f"negative {name}", lambda a, i=index: a.__setitem__(i, -1)))
    return faults


def _shrink(shape: tuple[int, ...], d: int) -> tuple[int, ...]:
    dims = list(shape)
    dims[d] = max(dims[d] - 1, 0) if dims[d] else 1
    if dims[d] == shape[d]:
        dims[d] += 1  # a zero dimension: change it the other way
    return tuple(dims)


def test_every_single_fault_is_refused_before_launch(family: tuple[PreparedLaunch, RecordingDriver]) -> None:
    launch, driver = family
    launch.checked(*good_call(launch))
    assert len(driver.calls) == 1
    refused = []
    for what, apply in _faults(launch):
        args = good_call(launch)
        apply(args)
        before = len(driver.calls)
        try:
            launch.checked(*args)
        except LaunchArgumentError as err:
            assert isinstance(err, ValueError)
            refused.append(what)
        else:
            # Only a grown dimension (a zero dim made one larger) may pass: it is bigger, not smaller.
            assert "short" in what and len(driver.calls) == before + 1, f"{launch.name}: {what} was launched"
            continue
        assert len(driver.calls) == before, f"{launch.name}: {what} launched before refusing"
    assert len(refused) >= 8, refused
    with pytest.raises(LaunchArgumentError, match="count is wrong"):
        launch.checked(*good_call(launch)[:-1])


def test_launches_carry_the_spec_grid_and_block(family: tuple[PreparedLaunch, RecordingDriver]) -> None:
    """The generated call and checked() launch exactly the geometry the spec gives."""
    launch, driver = family
    rng = random.Random(7)
    for _ in range(20):
        args = good_call(
            launch,
            num_tokens=rng.randrange(1, 300),
            num_rows=rng.randrange(1, 300),
            num_elements=8 * rng.randrange(1, 128),
        )
        scalars = {a.name: v for a, v in zip(launch.args, args, strict=True) if not a.is_pointer}
        want = (
            *launch.entry.geometry.grid_of({**launch.entry.params, **scalars}),
            *launch.entry.static.block,
        )
        for call in (launch, launch.checked):
            call(*args)
            assert driver.calls[-1][0] + driver.calls[-1][1] == want, (launch.name, scalars)


def test_the_documented_size_rules_launch(family: tuple[PreparedLaunch, RecordingDriver]) -> None:
    launch, driver = family
    for i, arg in enumerate(launch.args):
        if not arg.is_pointer:
            continue
        for grow in ("leading", "flat", "buffer"):
            args = good_call(launch)
            t: FakeTensor = args[i]
            if grow == "leading":
                t.shape = (t.shape[0] + 3, *t.shape[1:])
            elif grow == "flat":
                t.shape = (math.prod(t.shape) + 1,)
            else:
                args[i] = Buffer(t.address, t.nbytes())
            before = len(driver.calls)
            launch.checked(*args)
            assert len(driver.calls) == before + 1, (launch.name, arg.name, grow)


def test_error_names_argument_expected_and_actual_shape(driver: RecordingDriver) -> None:
    pick, _ = FAMILIES["moe_topk_sum.yaml"]
    launch = PreparedLaunch(entry_for("moe_topk_sum.yaml", pick), 0, None, 7)
    args = good_call(launch, num_tokens=4)
    args[1].shape = (1, 8, 7168)  # routed for 1 token, num_tokens = 4
    with pytest.raises(LaunchArgumentError) as err:
        launch.checked(*args)
    msg = str(err.value)
    assert "argument 'routed'" in msg and "(4, 8, 7168)" in msg and "(1, 8, 7168)" in msg
    args = good_call(launch, num_tokens=4)
    args[4] = -3
    with pytest.raises(LaunchArgumentError, match=r"num_tokens >= 0.*num_tokens=-3"):
        launch.checked(*args)
    assert not driver.calls


def test_random_calls_never_launch_with_a_buffer_too_small(
    family: tuple[PreparedLaunch, RecordingDriver],
) -> None:
    launch, driver = family
    rng = random.Random(19)
    launched = refused = 0
    for _ in range(400):
        args = good_call(
            launch,
            **{n: rng.randrange(0, 40) for n in ("num_tokens", "num_rows")},
            num_elements=8 * rng.randrange(0, 40),
        )
        for i, arg in enumerate(launch.args):
            if arg.is_pointer and rng.random() < 0.4:
                t = args[i]
                t.shape = tuple(max(d + rng.choice((-2, -1, 0, 0, 1)), 0) for d in t.shape)
            elif not arg.is_pointer and rng.random() < 0.15:
                args[i] = args[i] + rng.choice((-50, -1, 1, 50))
        before = len(driver.calls)
        try:
            launch.checked(*args)
        except LaunchArgumentError:
            refused += 1
            assert len(driver.calls) == before
            continue
        launched += 1
        scalars = {a.name: v for a, v in zip(launch.args, args, strict=True) if not a.is_pointer}
        need = launch.shapes(**scalars)
        for arg, value in zip(launch.args, args, strict=True):
            if arg.is_pointer:
                assert value.nbytes() >= math.prod(need[arg.name]) * DTYPES[arg.dtype].itemsize, arg.name
    assert launched and refused, (launched, refused)


def test_shapes_names_missing_scalars() -> None:
    pick, _ = FAMILIES["moe_w4a16.yaml"]
    entry = entry_for("moe_w4a16.yaml", pick)
    shapes = entry.shapes(num_tokens=3, num_experts=300)
    assert shapes["out"] == (3, 8, 2048) and shapes["w"] == (256, 2048, 3584)
    assert shapes["scratch"] == (4 + (2 + 24) * 17,)
    with pytest.raises(LaunchArgumentError, match="takes the values num_experts, num_tokens"):
        entry.shapes(num_tokens=3)


def test_specs_give_every_pointer_a_shape() -> None:
    for path in sorted(Path(SPECS).glob("*.yaml")):
        spec = load_spec(path)
        unshaped = [a.name for a in spec.args if a.kind == "ptr" and a.shape is None]
        assert not unshaped, f"{path.name}: {unshaped}"


def synthetic(
    args: list[dict], grid: list, requires: tuple[str, ...] = (), params: dict | None = None
) -> IndexEntry:
    """An index entry for a made-up ABI, to reach the corners no bundled spec has."""
    launch = {"grid": grid, "block": [32, 1, 1], "smem": 0, "cluster": None, "requires": list(requires)}
    row = (
        "k" * 64,
        "test.abi",
        1,
        "sm_90a",
        canonical_json(params or {}),
        "0" * 64,
        "kernel",
        canonical_json(args),
        canonical_json(launch),
        None,
    )
    return IndexEntry(row)


def test_corners_raise_launch_argument_errors(driver: RecordingDriver) -> None:
    f32 = synthetic([{"name": "x", "kind": "f32"}], [1, 1, 1])
    launch = PreparedLaunch(f32, 0, None, 7)
    for bad in (1e300, float("inf"), float("nan")):
        with pytest.raises(LaunchArgumentError, match="finite number in f32 range"):
            launch.checked(bad)
    launch.checked(2.5)

    divided = synthetic(
        [
            {"name": "p", "kind": "ptr", "dtype": "u8", "align": 1, "shape": ["64 // n"]},
            {"name": "n", "kind": "i32"},
        ],
        [1, 1, 1],
    )
    launch = PreparedLaunch(divided, 0, None, 7)
    with pytest.raises(LaunchArgumentError, match="cannot be evaluated"):
        launch.checked(Buffer(1 << 32, 64), 0)

    with pytest.warns(UncheckedSizeWarning, match="no shape for p"):
        unsized = PreparedLaunch(
            synthetic([{"name": "p", "kind": "ptr", "dtype": "u8", "align": 1}], [1, 1, 1]), 0, None, 7
        )
    with pytest.raises(LaunchArgumentError, match=r"address in \[0, 2\*\*64\)"):
        unsized.checked(-16)
    unsized.checked(16)

    empty = PreparedLaunch(synthetic([], [1, 1, 1]), 0, None, 7)
    empty.checked()
    with pytest.raises(LaunchArgumentError, match="count is wrong"):
        empty.checked(1)

    tall = PreparedLaunch(synthetic([{"name": "n", "kind": "i32"}], [1, "n", 1]), 0, None, 7)
    tall.checked(65535)
    with pytest.raises(LaunchArgumentError, match="grid"):
        tall.checked(65536)
    assert len(driver.calls) == 4


def test_a_cluster_variant_launches_with_its_cluster_size(
    driver: RecordingDriver, cluster_driver: RecordingClusterDriver
) -> None:
    # The DSL's cubins carry no cluster size: a variant with clusters of several CTAs goes
    # through cuLaunchKernelEx with it; its one-CTA twin (a cluster of 1) the plain way.
    pick, _ = FAMILIES["moe_w4a16.yaml"]
    pick = {**pick, "n": 256, "tile_n": 64, "cta_threads": 128, "split_k": 2, "w_layout": "n64k128"}
    for tokens in (0, 1, 5, 40):
        for ctas in (4, 1):
            launch = PreparedLaunch(entry_for("moe_w4a16.yaml", {**pick, "k_ctas": ctas}), 0, None, 7)
            assert (launch.entry.static.cluster is None) == (ctas == 1)
            args = good_call(launch, num_tokens=tokens)
            scalars = {a.name: v for a, v in zip(launch.args, args, strict=True) if not a.is_pointer}
            grid = launch.entry.geometry.grid_of({**launch.entry.params, **scalars})
            before = len(driver.calls), len(cluster_driver.calls)
            for call in (launch, launch.checked):
                call(*args)
            if tokens == 0:  # an empty grid launches nothing, either way
                assert (len(driver.calls), len(cluster_driver.calls)) == before
                continue
            if ctas == 1:
                assert len(cluster_driver.calls) == before[1]
                assert [c[:4] for c in driver.calls[before[0] :]] == [
                    (grid, (128, 1, 1), launch.entry.static.smem, 7)
                ] * 2
                one_cta_grid = grid
            else:
                assert len(driver.calls) == before[0]
                want = (grid, (128, 1, 1), launch.entry.static.smem, 7, (4, 1, 1))
                assert cluster_driver.calls[before[1] :] == [want] * 2
                cluster_grid = grid
        if tokens:
            assert cluster_grid == (one_cta_grid[0] * 4, *one_cta_grid[1:])  # 4 CTAs per block
