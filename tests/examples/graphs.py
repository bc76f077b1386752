"""The grid a launch issues, read back from a CUDA graph captured around it (cuda.bindings)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from b12x_aot.loader import check


def captured_grids(launch: Callable[[Any], None]) -> list[tuple[int, int, int]]:
    """Capture ``launch(stream)`` on a new stream; the grid of every kernel node it made."""
    from cuda.bindings import driver as cu

    stream = check(cu.cuStreamCreate(0), "cuStreamCreate")
    try:
        check(
            cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "capture"
        )
        launch(stream)
        graph = check(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
        _, count = check(cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")
        nodes, _ = check(cu.cuGraphGetNodes(graph, count), "cuGraphGetNodes")
        grids = []
        for node in nodes:
            if check(cu.cuGraphNodeGetType(node), "type") == cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                p = check(cu.cuGraphKernelNodeGetParams(node), "params")
                grids.append((p.gridDimX, p.gridDimY, p.gridDimZ))
        check(cu.cuGraphDestroy(graph), "cuGraphDestroy")
        return grids
    finally:
        check(cu.cuStreamDestroy(stream), "cuStreamDestroy")


def launched_grids(launch: Callable[..., None], *args: Any) -> list[tuple[int, int, int]]:
    """The grids ``launch(*args, stream=...)`` launches, captured."""
    return captured_grids(lambda stream: launch(*args, stream=stream))
