"""The loader on a GPU: graph safety, bad launch inputs, several threads and devices."""

from __future__ import annotations

import threading

import pytest

from b12x_aot.loader import CaptureError, LaunchArgumentError, VariantMissError

from ..conftest import family_variants
from ..kernels.reference import same_bits
from ..kernels.test_topk_sum_gpu import NUM_EXPERTS, exact_reference, make_inputs

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _variant(registry, arch: str, index: int = 0):
    entry = family_variants(registry, "moe.topk_sum", arch)[index]
    return entry, dict(entry.params)


def _out(m: int, p: dict, device: str = "cuda") -> torch.Tensor:
    return torch.full((m, p["hidden"]), float("nan"), device=device, dtype=DTYPES[p["output"]])


def test_load_and_miss_during_capture_raise_and_keep_the_capture(gpu_registry_path, device_arch) -> None:
    from b12x_aot.loader import Registry

    registry = Registry.open(gpu_registry_path)  # fresh: nothing loaded yet
    entries = family_variants(registry, "moe.topk_sum", device_arch)
    first, second = dict(entries[0].params), dict(entries[1].params)
    prepared = registry.kernel("moe.topk_sum", 1, **first).prepare()
    gen = torch.Generator(device="cuda").manual_seed(3)
    m = 8
    inputs = make_inputs(m, first, gen)
    out = _out(m, first)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        prepared(out, inputs["routed"], inputs["weights"], inputs["route_ids"], m, NUM_EXPERTS)
    torch.cuda.synchronize()
    loads = registry.stats.loads
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        with pytest.raises(CaptureError, match=r"loading moe\.topk_sum variant"):
            registry.kernel("moe.topk_sum", 1, **second)  # not preloaded
        with pytest.raises(CaptureError, match="a registry miss") as miss:
            registry.kernel("moe.topk_sum", 1, **{**first, "hidden": 12345})
        assert isinstance(miss.value.__cause__, VariantMissError)
        again = registry.kernel("moe.topk_sum", 1, **first)  # preloaded: no driver call
        assert again.entry is prepared.entry
        prepared(out, inputs["routed"], inputs["weights"], inputs["route_ids"], m, NUM_EXPERTS)
    assert registry.stats.loads == loads
    out.fill_(float("nan"))
    graph.replay()  # the capture survived our refusals
    torch.cuda.synchronize()
    assert same_bits(out, exact_reference(inputs, first))
    # Libraries stay loaded while the registry lives, even with no handle left in Python.
    del prepared, again
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert same_bits(out, exact_reference(inputs, first))
    registry.close()


def test_checked_launch_rejects_bad_inputs_before_launching(gpu_registry, device_arch) -> None:
    entry, p = _variant(gpu_registry, device_arch)
    prepared = gpu_registry.kernel(entry.family, entry.abi, **p).prepare()
    gen = torch.Generator(device="cuda").manual_seed(11)
    m = 4
    good = make_inputs(m, p, gen)
    out = _out(m, p)
    args = [out, good["routed"], good["weights"], good["route_ids"], m, NUM_EXPERTS]

    def expect(index: int, value: object, fragment: str) -> None:
        bad = list(args)
        bad[index] = value
        out.fill_(float("nan"))
        with pytest.raises(LaunchArgumentError, match=fragment) as err:
            prepared.checked(*bad)
        assert isinstance(err.value, ValueError)
        torch.cuda.synchronize()
        assert torch.isnan(out).all(), "nothing may be launched on bad input"

    wrong_dtype = good["weights"].half()
    expect(2, wrong_dtype, "must have dtype torch.float32")
    flat = torch.empty(m * p["topk"] * p["hidden"] + 8, device="cuda", dtype=good["routed"].dtype)
    misaligned = flat[1 : 1 + good["routed"].numel()].view_as(good["routed"])
    expect(1, misaligned, "must be 16-byte aligned")
    expect(3, good["route_ids"].cpu(), "must be on cuda:0")
    strided = torch.empty(m, 2 * p["topk"], device="cuda", dtype=torch.float32)[:, ::2]
    expect(2, strided, "must be contiguous")
    expect(4, 2**31, r"must be in \[-2147483648, 2147483647\]")
    expect(5, 1.5, "must be an int")
    expect(0, "0xdead", "must be a device pointer")
    with pytest.raises(LaunchArgumentError, match="count is wrong"):
        prepared.checked(*args[:-1])
    prepared.checked(*args)
    torch.cuda.synchronize()
    assert same_bits(out, exact_reference(good, p))


def test_two_threads_two_streams(gpu_registry, device_arch) -> None:
    entry, p = _variant(gpu_registry, device_arch, -1)
    kernel = gpu_registry.kernel(entry.family, entry.abi, **p)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            torch.cuda.set_device(0)
            stream = torch.cuda.Stream()
            prepared = kernel.prepare(device=0)
            gen = torch.Generator(device="cuda").manual_seed(seed)
            with torch.cuda.stream(stream):
                for _ in range(20):
                    m = 33
                    inputs = make_inputs(m, p, gen)
                    out = _out(m, p)
                    prepared(out, inputs["routed"], inputs["weights"], inputs["route_ids"], m, NUM_EXPERTS)
                    stream.synchronize()
                    assert same_bits(out, exact_reference(inputs, p))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.multigpu
def test_two_devices_from_two_threads(gpu_registry, device_arch) -> None:
    entry, p = _variant(gpu_registry, device_arch, -1)
    errors: list[BaseException] = []
    results: dict[int, int] = {}

    def worker(device: int) -> None:
        try:
            torch.cuda.set_device(device)
            kernel = gpu_registry.kernel(entry.family, entry.abi, device=device, **p)
            prepared = kernel.prepare(device=device)
            stream = torch.cuda.Stream(device=device)
            gen = torch.Generator(device=f"cuda:{device}").manual_seed(device)
            with torch.cuda.stream(stream):
                for _ in range(20):
                    m = 17
                    inputs = make_inputs(m, p, gen)
                    out = _out(m, p, device=f"cuda:{device}")
                    prepared.checked(
                        out, inputs["routed"], inputs["weights"], inputs["route_ids"], m, NUM_EXPERTS
                    )
                    stream.synchronize()
                    assert same_bits(out, exact_reference(inputs, p))
            results[device] = len(kernel.devices)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    kernel = gpu_registry.kernel(entry.family, entry.abi, device=0, **p)
    assert kernel.devices == (0, 1)  # one function handle per device
