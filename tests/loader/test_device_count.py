"""``device_count`` tells a machine without a GPU from a broken driver (runs on any machine)."""

from __future__ import annotations

import pytest

from b12x_aot.loader import _cuda
from b12x_aot.loader.errors import CudaError


@pytest.mark.parametrize(
    ("name", "count"),
    [
        ("DRIVER_NOT_FOUND", 0),
        ("CUDA_ERROR_STUB_LIBRARY", 0),
        ("CUDA_ERROR_NO_DEVICE", 0),
        ("CUDA_ERROR_INVALID_DEVICE", None),  # a broken driver: raises, no GPU test may skip
    ],
)
def test_device_count_is_zero_only_without_a_gpu(monkeypatch: pytest.MonkeyPatch, name: str, count) -> None:
    def failing_init() -> None:
        raise CudaError("cuInit", 1, name, "as the driver answered")

    monkeypatch.setattr(_cuda, "ensure_init", failing_init)
    if count is None:
        with pytest.raises(CudaError, match=name):
            _cuda.device_count()
    else:
        assert _cuda.device_count() == count
