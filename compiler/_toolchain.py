"""The toolchain fingerprint: every installed nvidia-cutlass-dsl* distribution, and options.

Read from package metadata, not by importing the DSL. The ptxas that assembled a cubin is
recorded per kernel from the cubin itself (``KernelResources``/``CubinInfo``).
"""

from __future__ import annotations

import importlib.metadata

from b12x_aot.registry import Toolchain

from .errors import ToolchainError

__all__ = ["COMPILE_OPTIONS", "current_toolchain"]

# Options every variant is compiled with (besides --gpu-arch, which the arch fixes).
COMPILE_OPTIONS = "--keep-cubin --opt-level 3"


def current_toolchain(options: str = COMPILE_OPTIONS) -> Toolchain:
    """The toolchain of this environment. Raises :class:`ToolchainError` if the DSL is absent."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-cutlass-dsl"):
            found[name] = dist.version
    if "nvidia-cutlass-dsl" not in found:
        raise ToolchainError(
            "nvidia-cutlass-dsl is not installed; install the project (pip install -e .) "
            "to get the CuTe DSL toolchain"
        )
    return Toolchain(tuple(sorted(found.items())), options)
