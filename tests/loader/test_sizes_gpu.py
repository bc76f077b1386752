"""On a GPU, a call of every family with a buffer one row too small is refused before anything
runs, and the process keeps working: the next, right-sized call gives the right answer."""

from __future__ import annotations

import pytest

from b12x_aot.comm import CapacityError, create_local_group
from b12x_aot.loader import LaunchArgumentError

from ..conftest import family_variants
from ..kernels.exact_size_launches import tensors_for

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def _short(t: torch.Tensor) -> torch.Tensor:
    """The same tensor one row (or, when 1-D, one element) short."""
    return t[:-1] if t.dim() > 0 and t.shape[0] > 0 else t


@pytest.mark.parametrize("family", ["moe.topk_sum", "quant.mxfp8", "moe.route_pack", "moe.w4a16"])
def test_a_short_buffer_is_refused_and_the_next_call_works(gpu_registry, device_arch, family: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(4)
    entry = family_variants(gpu_registry, family, device_arch)[0]
    launch = gpu_registry.kernel(entry.family, entry.abi, **entry.params).prepare()
    scalars = {a.name: 12 for a in launch.args if not a.is_pointer}
    refused = 0
    for i, arg in enumerate(launch.args):
        if not arg.is_pointer:
            continue
        args = tensors_for(launch, scalars, gen)
        args[i] = _short(args[i])
        with pytest.raises(LaunchArgumentError, match=f"argument '{arg.name}'"):
            launch.checked(*args)
        refused += 1
    assert refused >= 2
    torch.cuda.synchronize()  # nothing was launched, and the context is healthy
    args = tensors_for(launch, scalars, gen)
    if family == "moe.w4a16":  # it reads the blocks route packing lays out: pack them first
        (pack_entry,) = [
            e
            for e in family_variants(gpu_registry, "moe.route_pack", device_arch)
            if all(e.params[k] == entry.params[k] for k in ("topk", "block_m", "e_cap"))
        ]
        pack = gpu_registry.kernel(pack_entry.family, pack_entry.abi, **pack_entry.params).prepare()
        ids = torch.randint(
            0, 12, (12, entry.params["topk"]), device="cuda", generator=gen, dtype=torch.int32
        )
        pack.checked(args[4], ids, 12, 12)
    out = args[0]
    out.view(torch.uint8).fill_(0xFF)
    launch.checked(*args)
    torch.cuda.synchronize()
    assert not bool((out.view(torch.uint8) == 0xFF).all()), "the right-sized call wrote nothing"


def test_an_all_reduce_over_capacity_is_refused_and_the_next_call_works(gpu_registry) -> None:
    comms = create_local_group(gpu_registry, world=2, capacity_bytes=4096, device=0, dtypes=("bf16",))
    try:
        big = torch.ones(4096, device="cuda", dtype=torch.bfloat16)  # 8 KiB: twice the capacity
        with pytest.raises(CapacityError, match="exceeds the communicator's capacity of 4096 bytes"):
            comms[0].all_reduce(big)
        inputs = [torch.full((2048,), float(r + 1), device="cuda", dtype=torch.bfloat16) for r in range(2)]
        main = torch.cuda.current_stream()
        streams = [torch.cuda.ExternalStream(c.stream) for c in comms]
        outs = []
        for comm, stream, x in zip(comms, streams, inputs, strict=True):
            stream.wait_stream(main)
            outs.append(comm.all_reduce(x, stream=stream))
        for stream in streams:
            main.wait_stream(stream)
        torch.cuda.synchronize()
        assert all(bool((out == 3).all()) for out in outs)
    finally:
        torch.cuda.synchronize()
        for c in comms:
            c.close()
