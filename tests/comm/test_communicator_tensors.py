"""The communicator's tensor hot path, checked without a GPU on fake tensors (torch for the
dtypes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from b12x_aot.comm import CommArgumentError

from .fake_communicator import make, only_call

torch = pytest.importorskip("torch")


class FakeTensor:
    """The parts of a CUDA tensor the communicator reads (this machine's torch may lack CUDA)."""

    def __init__(self, n: int, dtype: Any, ptr: int, *, device: int = 0, contiguous: bool = True) -> None:
        self.n, self.dtype, self.ptr, self.contiguous = n, dtype, ptr, contiguous
        self.device = SimpleNamespace(type="cuda", index=device)

    def numel(self) -> int:
        return self.n

    def data_ptr(self) -> int:
        return self.ptr

    def is_contiguous(self) -> bool:
        return self.contiguous

    def stride(self) -> tuple[int, ...]:
        return (1,) if self.contiguous else (2,)


def test_tensor_call_launches_with_its_pointers() -> None:
    comm, launches, _, _ = make()
    inp = FakeTensor(64, torch.float16, 0x10000)
    out = FakeTensor(64, torch.float16, 0x20000)
    assert comm.all_reduce(inp, out) is out
    key, args = only_call(launches)
    assert key == ("fp16", "oneshot", "pull")
    assert args[:2] == (0x20000, 0x10000)


def test_tensor_out_defaults_to_empty_like(monkeypatch: pytest.MonkeyPatch) -> None:
    comm, launches, _, _ = make()
    inp = FakeTensor(64, torch.bfloat16, 0x10000)
    made = FakeTensor(64, torch.bfloat16, 0x30000)
    monkeypatch.setattr(comm, "_torch", SimpleNamespace(empty_like=lambda t: made))
    assert comm.all_reduce(inp) is made
    assert only_call(launches)[1][:2] == (0x30000, 0x10000)


def test_zero_element_tensor_launches_nothing() -> None:
    comm, launches, _, _ = make()
    inp, out = FakeTensor(0, torch.bfloat16, 0x10000), FakeTensor(0, torch.bfloat16, 0x20000)
    assert comm.all_reduce(inp, out) is out
    assert not any(launch.calls for launch in launches.values())


@pytest.mark.parametrize(
    ("inp", "out", "problem"),
    [
        (FakeTensor(64, torch.float32, 0x10000), None, "must be a tensor of one of"),
        (FakeTensor(64, torch.bfloat16, 0x10000, device=1), None, "must be on cuda:0"),
        (FakeTensor(64, torch.bfloat16, 0x10000, contiguous=False), None, "must be contiguous"),
        (FakeTensor(64, torch.bfloat16, 0x10000), FakeTensor(64, torch.float16, 0x20000), "inp's dtype"),
        (FakeTensor(64, torch.bfloat16, 0x10000), FakeTensor(72, torch.bfloat16, 0x20000), "64 elements"),
        (
            FakeTensor(64, torch.bfloat16, 0x10000),
            FakeTensor(64, torch.bfloat16, 0x20000, contiguous=False),
            "out must be contiguous",
        ),
        (FakeTensor(60, torch.bfloat16, 0x10000), FakeTensor(60, torch.bfloat16, 0x20000), "multiple of 8"),
        (FakeTensor(64, torch.bfloat16, 0x10008), FakeTensor(64, torch.bfloat16, 0x20000), "aligned"),
    ],
)
def test_bad_tensors(inp: Any, out: Any, problem: str) -> None:
    comm, launches, _, _ = make()
    with pytest.raises(CommArgumentError, match=problem):
        comm.all_reduce(inp, out)
    assert not any(launch.calls for launch in launches.values())


def test_a_cpu_tensor_is_refused() -> None:
    comm, _, _, _ = make()
    with pytest.raises(CommArgumentError, match=r"must be on cuda:0 .got cpu"):
        comm.all_reduce(torch.zeros(64, dtype=torch.bfloat16))


def test_torch_streams_become_raw_handles() -> None:
    comm, launches, _, _ = make()
    stream = SimpleNamespace(cuda_stream=1234)
    comm.all_reduce(
        FakeTensor(8, torch.bfloat16, 0x10000), FakeTensor(8, torch.bfloat16, 0x20000), stream=stream
    )
    assert only_call(launches)[1][-1] == 1234
