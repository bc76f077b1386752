"""A tensor's bytes as a sha256 digest: outputs of seeded runs compare across processes."""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["digest"]


def digest(tensor: Any) -> str:
    """sha256 (hex) of ``tensor``'s elements in row-major order, copied to the CPU.

    Only the bytes count, not the dtype or shape: compare digests of like outputs. The bytes
    are read through a uint8 view, so dtypes numpy lacks (bf16, fp8) digest too.
    """
    import torch

    flat = tensor.detach().reshape(-1).contiguous().cpu()
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()
