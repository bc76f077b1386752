"""``b12x::all_reduce`` over virtual ranks: eager, in one CUDA graph of every rank, and under
``torch.compile(fullgraph=True)``, bit-identical to the fixed-order fp32 reference."""

from __future__ import annotations

import pytest

from b12x_aot.comm import create_local_group

from ..comm.test_allreduce_gpu import draw, reference

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def test_all_reduce_op_eager_graph_and_compile(gpu_registry) -> None:
    from b12x_aot.ops import register_all_reduce

    world, n = 2, 3 * 7168
    comms = create_local_group(gpu_registry, world=world, capacity_bytes=n * 2, device=0, dtypes=("bf16",))
    try:
        ops = [register_all_reduce(c, namespace="b12x_test_comm") for c in comms]
        streams = [torch.cuda.ExternalStream(c.stream) for c in comms]
        compiled = [torch.compile(op.op, fullgraph=True) for op in ops]

        def run(fns, inputs):
            main = torch.cuda.current_stream()
            outs = []
            for fn, op, stream, x in zip(fns, ops, streams, inputs, strict=True):
                stream.wait_stream(main)
                with torch.cuda.stream(stream):
                    outs.append(fn(x, op.handle))
            for stream in streams:
                main.wait_stream(stream)
            return outs

        inputs = draw(world, n, torch.bfloat16, seed=3)
        for out in run([op.op for op in ops], inputs):
            assert torch.equal(out.view(torch.int16), reference(inputs).view(torch.int16))

        static = [x.clone() for x in inputs]
        run([op.op for op in ops], static)  # warm-up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run([op.op for op in ops], static)
        for seed in range(4, 8):
            fresh = draw(world, n, torch.bfloat16, seed=seed)
            for s, f in zip(static, fresh, strict=True):
                s.copy_(f)
            graph.replay()
            torch.cuda.synchronize()
            for out in captured:
                assert torch.equal(out.view(torch.int16), reference(fresh).view(torch.int16)), seed

        fresh = draw(world, n, torch.bfloat16, seed=9)
        for out in run(compiled, fresh):
            assert torch.equal(out.view(torch.int16), reference(fresh).view(torch.int16))
        for c in comms:
            c.check()
        with pytest.raises(ValueError, match="multiple of 8"):
            ops[0](torch.zeros(7, device="cuda", dtype=torch.bfloat16))
    finally:
        torch.cuda.synchronize()
        for c in comms:
            c.close()
