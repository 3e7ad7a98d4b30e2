"""Trace-time routing under torch.compile: with static shapes a fallback route is the plain torch op in the graph
(inductor sees it), a kernel route the thin custom op; dynamic shapes keep run-time routing (the custom op)."""

from __future__ import annotations

from typing import Any

import pytest

from hwprofile import ops
from hwprofile.optable import OPS

from .reference import operands
from .test_gates import FakeLauncher, fake  # noqa: F401 - the fixture, shared

torch = pytest.importorskip("torch")
ops.register()


def graph_targets(fn: Any, args: tuple[Any, ...], dynamic: bool = False) -> tuple[set[str], Any]:
    """The call targets of the FX graph dynamo hands the backend, and the compiled result."""
    targets: set[str] = set()

    def backend(gm: Any, example_inputs: Any) -> Any:
        targets.update(str(nd.target) for nd in gm.graph.nodes if nd.op in ("call_function", "call_method"))
        return gm

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*args)
    return targets, out


def has_custom(targets: set[str], name: str) -> bool:
    return any(f"hwprofile.{name}" in t for t in targets)


@pytest.mark.parametrize("name", list(OPS))
def test_a_fallback_route_is_the_plain_torch_op_in_the_graph(name: str) -> None:
    fn = getattr(ops, name)
    args = operands(OPS[name], (2, 3), 24, 64)
    targets, out = graph_targets(lambda *a: fn(*a).float().sigmoid(), args)
    assert not has_custom(targets, name), f"{name}: the custom op is in the graph of a fallback route: {sorted(targets)}"
    assert any(t in "".join(targets) for t in ("mm", "linear")), sorted(targets)
    assert torch.equal(out, fn(*args).float().sigmoid())


@pytest.mark.parametrize("name", list(OPS))
def test_dynamic_shapes_keep_run_time_routing(name: str) -> None:
    fn = getattr(ops, name)
    args = operands(OPS[name], (5,), 24, 64)
    targets, out = graph_targets(lambda *a: fn(*a), args, dynamic=True)
    assert has_custom(targets, name), sorted(targets)
    assert torch.equal(out, fn(*args))


def test_a_kernel_route_is_the_custom_op_and_runs_the_kernel(fake: FakeLauncher) -> None:  # noqa: F811
    h, w = operands(OPS["router_gemm"], (4,), 256, 7168)
    targets, out = graph_targets(lambda a, b: ops.router_gemm(a, b).sigmoid(), (h, w))
    assert has_custom(targets, "router_gemm") and "torch.mm" not in targets
    assert fake.calls == [("router_gemm", 4, 256, 7168, 0)]
    assert torch.allclose(out, (h.double() @ w.double().t()).sigmoid().float(), atol=1e-5)


def test_outside_the_region_the_seamed_device_traces_the_fallback(fake: FakeLauncher) -> None:  # noqa: F811
    """M = 17 > router_gemm.max_tokens on the simulated H200: decided while tracing, nothing of hwprofile in the graph."""
    h, w = operands(OPS["router_gemm"], (17,), 256, 7168)
    targets, out = graph_targets(lambda a, b: ops.router_gemm(a, b), (h, w))
    assert not has_custom(targets, "router_gemm") and fake.calls == []
    assert torch.equal(out, ops.router_gemm(h, w))


def test_a_non_contiguous_operand_is_routed_to_the_fallback_while_tracing(fake: FakeLauncher) -> None:  # noqa: F811
    h = operands(OPS["router_gemm"], (4,), 256, 7168)[0]
    w = operands(OPS["router_gemm"], (4,), 256, 7168, layout="padded")[1]
    targets, _ = graph_targets(lambda a, b: ops.router_gemm(a, b), (h, w))
    assert not has_custom(targets, "router_gemm") and fake.calls == []


def test_out_is_filled_when_compiled_even_when_it_overlaps_an_input() -> None:
    """Compiled, out= is filled from a fresh result, so an out that is also the input is computed correctly."""
    x, w = operands(OPS["gemv"], (1,), 64, 64)
    expect = ops.gemv(x, w)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: ops.gemv(a, b, out=a), fullgraph=True, backend="aot_eager")
    compiled(x, w)
    assert torch.equal(x, expect)
