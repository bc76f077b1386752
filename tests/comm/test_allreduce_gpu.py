"""``comm.allreduce`` through the communicator, with virtual ranks on one GPU.

Every rank is a communicator of one process with its own stream; a call forks from torch's
current stream to every rank's stream and joins back, so all ranks' kernels run at once. The
expected output is the fp32 sum in rank order, rounded once, and it must come out bit for bit
on every rank, for both algorithms and both transports (so they also agree with each other),
for worlds of powers of two and not (3, 5, 9: pack counts that the world does not divide), up
to the layout's 16.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from b12x_aot.comm import CommTimeoutError, OccupancyError, Policy, create_local_group
from b12x_aot.comm._policy import ABI

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

FAMILY = "comm.allreduce"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HIDDEN = 7168
ROWS = (1, 2, 4, 8, 9, 16, 32)  # tokens of a decode/prefill step, 9 and its neighbours included
CAPACITY = 1536 * HIDDEN * 2  # the largest payload below, in bytes
WORLDS = (2, 3, 4, 5, 8, 9, 16)
COMBOS = [(a, t) for a in ("oneshot", "twoshot") for t in ("pull", "push")]


def payloads(world: int) -> list[int]:
    """Element counts: 1, world - 1, world and world + 1 packs (shards of unequal sizes, some
    empty), then rows of 7168 and of 3584 elements, then one large payload."""
    packs = sorted({1, max(world - 1, 1), world, world + 1})
    rows = [t * hidden for t in ROWS for hidden in (HIDDEN, HIDDEN // 2)]
    return [8 * p for p in packs] + rows + [1536 * HIDDEN]


def built_params(registry, family: str, arch: str, spec: str) -> list[dict]:
    """The params of ``family``'s variants of the runtime's abi for ``arch``; fails when none."""
    params = [
        dict(e.params) for e in registry.entries() if e.family == family and e.abi == ABI and e.arch == arch
    ]
    if not params:
        pytest.fail(
            f"the registry has no {family} variants for {arch}: build them with "
            f"`b12x-compile specs/{spec} --registry R --arch {arch}`"
        )
    return params


@pytest.fixture(scope="module")
def built(gpu_registry, device_arch) -> list[dict]:
    return built_params(gpu_registry, FAMILY, device_arch, "comm_allreduce.yaml")


def has(built: list[dict], world: int, dtype: str, algorithm: str, transport: str) -> bool:
    return any(
        p["world"] == world
        and p["dtype"] == dtype
        and p["algorithm"] == algorithm
        and p["transport"] == transport
        for p in built
    )


def policy_for(built: list[dict], world: int, dtypes: Sequence[str]) -> Policy:
    """The default policy, with a transport every dtype has both algorithms of. Past 8 ranks on
    one GPU, the smallest launch shape: all ranks' CTAs must be resident at once (16 x 8)."""
    shape = {} if world <= 8 else {"cta_threads": 256, "blocks": 8}
    for transport in ("pull", "push"):
        if all(has(built, world, d, a, transport) for d in dtypes for a in ("oneshot", "twoshot")):
            return Policy(transport=transport, **shape)
    pytest.skip(f"{FAMILY} world={world} {'/'.join(dtypes)}: no transport has both algorithms built")


def local_group(registry, world: int, **kwargs) -> list:
    """``create_local_group``, skipping where this GPU cannot hold every rank's grid at once."""
    try:
        return create_local_group(registry, world=world, device=0, **kwargs)
    except OccupancyError as exc:
        pytest.skip(f"{world} virtual ranks do not fit one GPU: {exc}")


@pytest.fixture(scope="module")
def groups(gpu_registry, built):
    """One group of virtual ranks per world size, created on first use, closed at the end."""
    made: dict[int, list] = {}

    def get(world: int) -> list:
        if world not in made:
            dtypes = tuple(d for d in DTYPES if any(p["world"] == world and p["dtype"] == d for p in built))
            if not dtypes:
                pytest.skip(f"{FAMILY} has no world={world} variants in the registry")
            made[world] = local_group(
                gpu_registry,
                world,
                capacity_bytes=CAPACITY,
                dtypes=dtypes,
                policy=policy_for(built, world, dtypes),
            )
        return made[world]

    yield get
    for comms in made.values():
        for comm in comms:
            comm.close()


def rank_streams(comms) -> list:
    return [torch.cuda.ExternalStream(comm.stream) for comm in comms]


def all_reduce(comms, inputs, outputs, **kwargs) -> None:
    """Fork from the current stream to every rank's stream, launch every rank, join back."""
    main = torch.cuda.current_stream()
    streams = rank_streams(comms)
    for stream in streams:
        stream.wait_stream(main)
    for comm, stream, inp, out in zip(comms, streams, inputs, outputs, strict=True):
        comm.all_reduce(inp, out, stream=stream, **kwargs)
    for stream in streams:
        main.wait_stream(stream)


def draw(world: int, n: int, dtype: torch.dtype, seed: int) -> list:
    """Fresh inputs whose magnitude depends on the position (exponents from 2^-8 to 2^8), so a
    misplaced or dropped pack changes the result."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scale = torch.exp2((torch.arange(n, device="cuda") % 17 - 8).float())
    return [(torch.randn(n, device="cuda", generator=gen) * scale).to(dtype) for _ in range(world)]


def reference(inputs: Sequence) -> torch.Tensor:
    acc = inputs[0].float()
    for x in inputs[1:]:
        acc = acc + x.float()
    return acc.to(inputs[0].dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(("algorithm", "transport"), COMBOS)
def test_all_reduce_is_bit_identical_to_the_fixed_order_reference(
    groups, built, world: int, dtype: str, algorithm: str, transport: str
) -> None:
    if not has(built, world, dtype, algorithm, transport):
        pytest.skip(f"{FAMILY} world={world} {dtype} {algorithm}/{transport} is not in the registry")
    comms = groups(world)
    if dtype not in comms[0].dtypes:
        pytest.skip(f"{FAMILY} world={world} has no {dtype} variants in the registry")
    torch_dtype = DTYPES[dtype]
    for i, n in enumerate(payloads(world)):
        for repeat in range(2):  # the second call uses the other parity of slots and flags
            inputs = draw(world, n, torch_dtype, seed=1000 * i + 10 * repeat + world)
            outputs = [torch.full_like(inputs[0], float("nan")) for _ in range(world)]
            all_reduce(comms, inputs, outputs, algorithm=algorithm, transport=transport)
            torch.cuda.synchronize()
            expect = reference(inputs)
            for rank, out in enumerate(outputs):
                assert same_bits(out, expect), f"rank {rank}, {n} elements, call {repeat}"
    for comm in comms:
        comm.check()


def test_policy_default_and_zero_elements(groups) -> None:
    comms = groups(2)
    dtype = DTYPES[comms[0].dtypes[0]]
    empty = [torch.empty(0, device="cuda", dtype=dtype) for _ in comms]
    outs = [torch.empty(0, device="cuda", dtype=dtype) for _ in comms]
    all_reduce(comms, empty, outs)  # launches nothing, so it cannot hang
    inputs = draw(2, 3 * HIDDEN, dtype, seed=5)
    outputs = [None, None]
    main = torch.cuda.current_stream()
    streams = rank_streams(comms)
    for stream in streams:
        stream.wait_stream(main)
    for r, (comm, stream) in enumerate(zip(comms, streams, strict=True)):
        with torch.cuda.stream(stream):
            outputs[r] = comm.all_reduce(inputs[r], stream=stream)  # out from empty_like
    for stream in streams:
        main.wait_stream(stream)
    torch.cuda.synchronize()
    assert all(same_bits(out, reference(inputs)) for out in outputs)


@pytest.mark.parametrize("world", WORLDS)
def test_one_cuda_graph_of_every_rank_replays_like_eager(groups, world: int) -> None:
    comms = groups(world)
    dtype = DTYPES[comms[0].dtypes[0]]
    n = 16 * HIDDEN
    static_in = draw(world, n, dtype, seed=1)
    static_out = [torch.full_like(static_in[0], float("nan")) for _ in range(world)]
    eager_out = [torch.empty_like(static_in[0]) for _ in range(world)]
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        all_reduce(comms, static_in, static_out)  # warm up outside the graph
    torch.cuda.current_stream().wait_stream(capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        all_reduce(comms, static_in, static_out)
    for replay in range(100):
        fresh = draw(world, n, dtype, seed=10_000 + replay)
        for dst, src in zip(static_in, fresh, strict=True):
            dst.copy_(src)
        for out in static_out:
            out.fill_(float("nan"))
        graph.replay()
        all_reduce(comms, static_in, eager_out)  # the same communicator, eagerly, right after
        torch.cuda.synchronize()
        expect = reference(fresh)
        for rank in range(world):
            assert same_bits(static_out[rank], eager_out[rank]), f"replay {replay}, rank {rank}"
            assert same_bits(static_out[rank], expect), f"replay {replay}, rank {rank}"
    for comm in comms:
        comm.check()


@pytest.mark.parametrize("world", [2, 9])
def test_a_rank_that_never_launches_times_out_the_others(gpu_registry, built, world: int) -> None:
    if not any(p["world"] == world for p in built):
        pytest.skip(f"{FAMILY} has no world={world} variants in the registry")
    dtype_name = next(d for d in DTYPES if any(p["world"] == world and p["dtype"] == d for p in built))
    comms = local_group(
        gpu_registry,
        world,
        capacity_bytes=1 << 20,
        dtypes=(dtype_name,),
        timeout_s=0.5,
        policy=policy_for(built, world, (dtype_name,)),
    )
    absent = world - 1
    try:
        inputs = draw(world, 8 * HIDDEN, DTYPES[dtype_name], seed=3)
        main = torch.cuda.current_stream()
        streams = rank_streams(comms)
        start = time.monotonic()
        for comm, stream, inp in zip(comms[:absent], streams, inputs, strict=False):
            stream.wait_stream(main)
            comm.all_reduce(inp, stream=stream)
        for rank in range(absent):
            with pytest.raises(CommTimeoutError) as err:
                comms[rank].check()
            e = err.value
            assert (e.rank, e.missing_rank) == (rank, absent)
            assert "unusable" in str(e) and f"for rank {absent}" in str(e)
        assert time.monotonic() - start < 0.5 + 10  # bounded: the kernels gave up
        with pytest.raises(CommTimeoutError):  # every later call refuses before launching
            comms[0].all_reduce(inputs[0])
        comms[absent].check()  # the absent rank itself saw nothing wrong
    finally:
        for comm in comms:
            comm.close()
    x = torch.arange(1024, device="cuda", dtype=torch.float32)
    assert (x * 2).sum().item() == 1023 * 1024  # the process and the device are still healthy
