"""``comm.allreduce_rmsnorm`` through the communicator, with virtual ranks on one GPU.

``residual_out`` must be bit for bit the documented fp32 order, emulated with torch fp32 adds in
the same order (``((x_0 + x_1) + ...) + residual``, rounded once). ``out`` goes through
``rsqrt.approx``, which torch cannot emulate, so it is held to a float64 reference within the
bound :func:`reference` states, to one ulp of a torch fp32 emulation of every other step in
the documented order, and to bit identity across ranks and between graph replay and eager.
"""

from __future__ import annotations

import pytest

from b12x_aot.comm import CommArgumentError
from b12x_aot.comm._fused import FUSED_FAMILY

from .test_allreduce_gpu import DTYPES, built, built_params, groups, rank_streams, same_bits
from .test_allreduce_gpu import reference as all_reduce_reference

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

__all__ = ["built", "groups"]  # comm.allreduce's fixtures: its variants and groups of virtual ranks

WORLDS = (2, 4, 9)
HIDDENS = (2048, 3584, 4096, 7168)
ROWS = (1, 2, 8, 9, 32)
EPS = 1e-6
SIGNIFICAND = {"bf16": 8, "fp16": 11}  # bits, the implicit one included


@pytest.fixture(scope="module")
def fused_built(gpu_registry, device_arch) -> list[dict]:
    return built_params(gpu_registry, FUSED_FAMILY, device_arch, "comm_allreduce_rmsnorm.yaml")


@pytest.fixture(scope="module")
def fused_groups(groups, fused_built):
    """comm.allreduce's groups of virtual ranks: creation loads the fused variants too."""
    return groups


def draw(world: int, rows: int, hidden: int, dtype: torch.dtype, seed: int):
    """Every rank's input and residual, and gamma; magnitudes vary with the position (2^-6 to
    2^6) so a misplaced pack changes the result."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scale = torch.exp2((torch.arange(hidden, device="cuda") % 13 - 6).float())

    def one() -> torch.Tensor:
        return (torch.randn(rows, hidden, device="cuda", generator=gen) * scale).to(dtype)

    inputs = [one() for _ in range(world)]
    residuals = [one() for _ in range(world)]
    for r in residuals[1:]:
        r.copy_(residuals[0])  # every rank holds the same residual stream
    gamma = (torch.rand(hidden, device="cuda", generator=gen) * 2 - 0.5).to(dtype)
    return inputs, residuals, gamma


def fused(comms, inputs, residuals, gamma, outs, residual_outs) -> None:
    """Fork from the current stream to every rank's stream, launch every rank, join back."""
    main = torch.cuda.current_stream()
    streams = rank_streams(comms)
    for stream in streams:
        stream.wait_stream(main)
    for r, (comm, stream) in enumerate(zip(comms, streams, strict=True)):
        comm.all_reduce_rmsnorm(
            inputs[r], residuals[r], gamma, EPS, out=outs[r], residual_out=residual_outs[r], stream=stream
        )
    for stream in streams:
        main.wait_stream(stream)


def emulate_y(inputs, residual) -> torch.Tensor:
    """The documented fp32 order: rank order, then the residual; fp32 adds on CUDA are add.rn."""
    acc = inputs[0].float()
    for x in inputs[1:]:
        acc = acc + x.float()
    return acc + residual.float()


def reference(inputs, residual, gamma):
    """float64 ``out`` and the bound its distance from the kernel's may not exceed.

    The fp32 sum of ``W + 1`` terms is within ``W * 2^-24 * sum |terms|`` of the exact one; the
    mean square (at most 48 adds deep, all terms positive), the divide, ``rsqrt.approx``
    (2^-22.9) and the two multiplies add under 2^-16 relative; rounding into the dtype adds half
    an ulp, at most ``2^-(significand)`` relative, or 2^-25 below fp16's normal range."""
    terms = [x.double() for x in inputs] + [residual.double()]
    y = sum(terms[1:], terms[0])
    rstd = torch.rsqrt((y * y).mean(dim=-1, keepdim=True) + EPS)
    g = gamma.double()
    out = y * rstd * g
    magnitude = sum((t.abs() for t in terms[1:]), terms[0].abs())
    p = SIGNIFICAND["bf16" if inputs[0].dtype == torch.bfloat16 else "fp16"]
    bound = out.abs() * (2.0**-p + 2.0**-16) + magnitude * rstd * g.abs() * len(inputs) * 2.0**-24 + 2.0**-25
    return out, bound


def emulate_out(y: torch.Tensor, gamma: torch.Tensor, per_thread: int) -> torch.Tensor:
    """Every step of the documented order in torch fp32 ops (each one rounding, as the kernel's),
    except ``rsqrt.approx``, for which torch's own fp32 rsqrt stands in."""
    rows, hidden = y.shape
    threads = hidden // (8 * per_thread)
    squares = (y * y).view(rows, per_thread, threads, 8)  # pack j * threads + t, element e
    q = torch.zeros(rows, threads, device=y.device)
    for j in range(per_thread):
        for e in range(8):
            q = q + squares[:, j, :, e]
    q = q.view(rows, threads // 32, 32)
    lanes = torch.arange(32, device=y.device)
    for k in (16, 8, 4, 2, 1):
        q = q + q[:, :, lanes ^ k]
    total = q[:, 0, 0]
    for w in range(1, threads // 32):
        total = total + q[:, w, 0]
    rstd = torch.rsqrt(total / hidden + EPS)
    return ((y * rstd[:, None]) * gamma.float()).to(gamma.dtype)


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable 16-bit values lie between ``a`` and ``b`` (+0 and -0 are one)."""

    def ordinal(t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.int16).int()
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordinal(a) - ordinal(b)).abs()


def check(inputs, residual, gamma, outs, residual_outs, where: str, per_thread: int) -> None:
    y = emulate_y(inputs, residual)
    expect_residual = y.to(inputs[0].dtype)
    out64, bound = reference(inputs, residual, gamma)
    for rank in range(len(outs)):
        assert same_bits(residual_outs[rank], expect_residual), f"{where}, rank {rank}: residual_out"
        assert same_bits(outs[rank], outs[0]), f"{where}, rank {rank}: out differs from rank 0's"
    excess = (outs[0].double() - out64).abs() - bound
    assert excess.max().item() <= 0, f"{where}: out beyond the float64 bound by {excess.max().item()}"
    # rsqrt.approx and torch's rsqrt differ by a few fp32 ulps: at most one ulp of the dtype.
    apart = ulps_apart(outs[0], emulate_out(y, gamma, per_thread)).max().item()
    assert apart <= 1, f"{where}: out is {apart} ulps from the fp32 emulation of the documented order"


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("hidden", HIDDENS)
def test_fused_matches_the_documented_order_on_every_rank(
    fused_groups, world: int, dtype: str, hidden: int
) -> None:
    comms = fused_groups(world)
    launch = comms[0]._fused.get((dtype, hidden))
    if launch is None:
        pytest.skip(f"{FUSED_FAMILY} {dtype} hidden={hidden} world={world} is not in the registry")
    torch_dtype = DTYPES[dtype]
    for i, rows in enumerate(ROWS):
        if rows > launch.max_rows:  # this GPU cannot hold every virtual rank's CTAs at once
            inputs, residuals, gamma = draw(world, rows, hidden, torch_dtype, seed=i)
            with pytest.raises(CommArgumentError, match="rows must be at most"):
                comms[0].all_reduce_rmsnorm(inputs[0], residuals[0], gamma, EPS)
            continue
        for repeat in range(2):  # the second call uses the other parity of slots
            inputs, residuals, gamma = draw(world, rows, hidden, torch_dtype, seed=100 * i + repeat + world)
            outs = [torch.full_like(inputs[0], float("nan")) for _ in range(world)]
            residual_outs = [torch.full_like(inputs[0], float("nan")) for _ in range(world)]
            fused(comms, inputs, residuals, gamma, outs, residual_outs)
            torch.cuda.synchronize()
            where = f"{rows} rows, call {repeat}"
            check(inputs, residuals[0], gamma, outs, residual_outs, where, launch.variant.packs_per_thread)
    for comm in comms:
        comm.check()


@pytest.mark.parametrize("world", WORLDS)
def test_in_place_and_interleaved_with_all_reduce(fused_groups, world: int) -> None:
    comms = fused_groups(world)
    dtype, hidden = next(iter(sorted(comms[0]._fused)))
    launch = comms[0]._fused[dtype, hidden]
    torch_dtype, rows = DTYPES[dtype], min(8, launch.max_rows)
    for call in range(3):  # an all-reduce between fused calls shares the call counter
        inputs, residuals, gamma = draw(world, rows, hidden, torch_dtype, seed=7 + call)
        keep_in, keep_res = [x.clone() for x in inputs], residuals[0].clone()
        fused(comms, inputs, residuals, gamma, inputs, residuals)  # out = inp, residual_out = residual
        plain = [x.clone() for x in keep_in]
        main = torch.cuda.current_stream()
        streams = rank_streams(comms)
        for stream in streams:
            stream.wait_stream(main)
        for comm, stream, x in zip(comms, streams, plain, strict=True):
            comm.all_reduce(x, x, stream=stream)
        for stream in streams:
            main.wait_stream(stream)
        torch.cuda.synchronize()
        check(
            keep_in,
            keep_res,
            gamma,
            inputs,
            residuals,
            f"in place, call {call}",
            launch.variant.packs_per_thread,
        )
        sums = all_reduce_reference(keep_in)
        assert all(same_bits(x, sums) for x in plain), f"all-reduce after fused call {call}"
    for comm in comms:
        comm.check()


@pytest.mark.parametrize("world", WORLDS)
def test_one_cuda_graph_of_every_rank_replays_like_eager(fused_groups, world: int) -> None:
    comms = fused_groups(world)
    dtype, hidden = max(comms[0]._fused)  # the widest hidden built
    launch = comms[0]._fused[dtype, hidden]
    torch_dtype, rows = DTYPES[dtype], min(9, launch.max_rows)
    inputs, residuals, gamma = draw(world, rows, hidden, torch_dtype, seed=1)
    outs = [torch.empty_like(inputs[0]) for _ in range(world)]
    residual_outs = [torch.empty_like(inputs[0]) for _ in range(world)]
    eager = [torch.empty_like(inputs[0]) for _ in range(world)]
    eager_res = [torch.empty_like(inputs[0]) for _ in range(world)]
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        fused(comms, inputs, residuals, gamma, outs, residual_outs)  # warm up outside the graph
    torch.cuda.current_stream().wait_stream(capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        fused(comms, inputs, residuals, gamma, outs, residual_outs)
    for replay in range(20):
        fresh, fresh_res, fresh_gamma = draw(world, rows, hidden, torch_dtype, seed=1000 + replay)
        for dst, src in zip([*inputs, *residuals, gamma], [*fresh, *fresh_res, fresh_gamma], strict=True):
            dst.copy_(src)
        for t in (*outs, *residual_outs):
            t.fill_(float("nan"))
        graph.replay()
        fused(comms, inputs, residuals, gamma, eager, eager_res)  # eagerly, right after
        torch.cuda.synchronize()
        per_thread = launch.variant.packs_per_thread
        check(fresh, fresh_res[0], fresh_gamma, outs, residual_outs, f"replay {replay}", per_thread)
        for rank in range(world):
            assert same_bits(outs[rank], eager[rank]), f"replay {replay}, rank {rank}"
            assert same_bits(residual_outs[rank], eager_res[rank]), f"replay {replay}, rank {rank}"
    for comm in comms:
        comm.check()
