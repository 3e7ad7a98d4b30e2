"""ops.moe_gate's selection kernel on the CPU: its route (``ops.decide_moe_gate``), the fallback for every shape it cannot
take, and any fault (load, launch) falling back with one warning, through the CPU seam of tests/ops/test_gates.py
(CPU tensors count as device 0 of a simulated H200, the kernels are fakes that compute the rules in float64).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.errors import KernelError
from hwprofile.kernels import _pipeline

from .reference import moe_gate as reference
from .test_gates import FakeLauncher, fake  # noqa: F401 - the fixture, shared
from .test_launch_faults import FailingKernel

torch = pytest.importorskip("torch")
ops.register()

DSV3 = {"top_k": 8, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}
KIMI = {"top_k": 8, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827}


def inputs(m: int, n: int, k: int = 64) -> tuple[Any, Any, Any]:
    g = torch.Generator().manual_seed(7 * m + n)
    return (torch.randn(m, k, generator=g).bfloat16(), (torch.randn(n, k, generator=g) * k**-0.5).bfloat16(),
            torch.randn(n, generator=g) * 0.05)


def gate_calls(f: FakeLauncher) -> list[tuple[Any, ...]]:
    return [c for c in f.calls if c[0] == "moe_gate"]


@pytest.mark.parametrize(("n", "kw"), [(256, DSV3), (384, KIMI)])
@pytest.mark.parametrize("m", [1, 4, 16])
def test_decode_gates_take_the_selection_kernel(fake: FakeLauncher, m: int, n: int, kw: dict[str, Any]) -> None:  # noqa: F811
    h, w, b = inputs(m, n)
    ids, weights = ops.moe_gate(h, w, b, **kw)
    assert gate_calls(fake) == [("moe_gate", m, n, kw["n_group"], 8)]
    want = ops._fallbacks.grouped_topk(ops.router_gemm(h, w), b, kw["n_group"], kw["topk_group"], 8, True, kw["routed_scaling_factor"])
    assert torch.equal(ids, want[0])
    torch.testing.assert_close(weights, want[1], rtol=1e-6, atol=0)
    assert ops.decide_moe_gate(hwprofile.profile(), m=m, n=n, n_group=kw["n_group"], topk_group=kw["topk_group"], top_k=8).path == "kernel"


@pytest.mark.parametrize(("m", "n", "kw", "why"), [
    (17, 256, DSV3, "M = 1..16 tokens, got M=17"),
    (4, 1024, {"top_k": 8, "n_group": 8, "topk_group": 4}, "N = 2..512 experts, got N=1024"),
    (4, 256, {"top_k": 8, "n_group": 64, "topk_group": 4}, "n_group = 1..32 dividing N"),
    (4, 512, {"top_k": 33}, "top_k = 1..32, got top_k=33"),
])
def test_shapes_the_kernel_cannot_take_run_the_torch_selection(
    fake: FakeLauncher, m: int, n: int, kw: dict[str, Any], why: str  # noqa: F811
) -> None:
    h, w, b = inputs(m, n)
    ids, _ = ops.moe_gate(h, w, b, **kw)
    assert gate_calls(fake) == []
    ref_ids, _ = reference(ops.router_gemm(h, w), b, kw.get("n_group", 1), kw.get("topk_group", 1), kw["top_k"], True,
                           kw.get("routed_scaling_factor", 1.0))
    assert ids.shape == (m, kw["top_k"]) and torch.equal(ids, ref_ids)
    d = ops.decide_moe_gate(hwprofile.profile(), m=m, n=n, n_group=kw.get("n_group", 1), topk_group=kw.get("topk_group", 1),
                            top_k=kw["top_k"])
    assert d.path == "fallback" and why in d.reason, d.reason


def test_gradients_cpu_tensors_and_compile_take_the_torch_selection(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    h, w, b = inputs(4, 256)
    ops.moe_gate(h, w.clone().requires_grad_(), b, **DSV3)[1].sum().backward()  # autograd needs the torch selection's graph
    assert gate_calls(fake) == []
    with torch.no_grad():
        ops.moe_gate(h, w.clone().requires_grad_(), b, **DSV3)
    assert len(gate_calls(fake)) == 1  # no grad mode: the kernel
    monkeypatch.setattr(ops._dispatch, "_cpu_index", -1)
    ops.moe_gate(h, w, b, **DSV3)  # plain CPU tensors: no kernel at all
    assert len(gate_calls(fake)) == 1
    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)
    monkeypatch.setattr(ops._dispatch, "_compiling", lambda: True)
    assert ops._gate.select(ops.router_gemm(h, w), b, 8, 4, 8, True, 2.5) is None  # traced: the torch selection, fused by inductor


def test_a_plugin_without_the_kernel_runs_the_torch_selection(monkeypatch: pytest.MonkeyPatch, fake: FakeLauncher) -> None:  # noqa: F811
    monkeypatch.setenv("HWPROFILE_DEVICE", "rtx-pro-6000")
    hwprofile.reset()
    ops.reset_dispatch()
    h, w, b = inputs(2, 256)
    ops.moe_gate(h, w, b, **DSV3)
    assert gate_calls(fake) == []
    d = ops.decide_moe_gate(hwprofile.profile(), m=2, n=256, n_group=8, topk_group=4, top_k=8)
    assert d.path == "fallback" and "ships no moe_gate selection kernel" in d.reason


def _real_gate_launch(monkeypatch: pytest.MonkeyPatch, kern: Any) -> list[str]:
    """The real ``_gate.launch`` with ``kernels.load`` giving ``kern`` (or raising it) and a fake stream."""
    monkeypatch.setattr(ops._gate, "launch", _REAL_LAUNCH)
    monkeypatch.setattr(ops._kernel, "raw_stream", lambda index: 0)
    loaded: list[str] = []

    def load(spec: Any, target: str, plan: Any, index: int, arg_types: Any, **kw: Any) -> Any:
        loaded.append(plan.name_expression)
        assert tuple(arg_types) == ops._gate.ARG_TYPES and plan.pdl and plan.grid[0] >= 1
        if isinstance(kern, Exception):
            raise kern
        return kern

    monkeypatch.setattr(_pipeline, "load", load)
    return loaded


_REAL_LAUNCH = ops._gate.launch


@pytest.mark.parametrize("fault", ["load", "launch"])
def test_a_fault_warns_once_then_falls_back_and_decide_says_why(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:  # noqa: F811
    err = KernelError("CUDA_ERROR_NO_BINARY_FOR_GPU")
    kern = FailingKernel(err)
    loaded = _real_gate_launch(monkeypatch, err if fault == "load" else kern)
    h, w, b = inputs(3, 256)
    want = ops._fallbacks.grouped_topk(ops.router_gemm(h, w), b, 8, 4, 8, True, 2.5)
    with pytest.warns(RuntimeWarning, match=r"moe_gate selection kernel unavailable on cuda:0, using the torch selection: .*NO_BINARY"):
        got = ops.moe_gate(h, w, b, **DSV3)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ops.moe_gate(h, w, b, **DSV3)  # failed before: the torch selection, silently
    assert torch.equal(got[0], want[0]) and len(loaded) == 1 and kern.launches == (fault == "launch")
    d = ops.decide_moe_gate(hwprofile.profile(), m=3, n=256, n_group=8, topk_group=4, top_k=8)
    assert d.path == "fallback" and "failed on cuda:0" in d.reason and "NO_BINARY" in d.reason
    ops.reset_dispatch()
    hwprofile.reset()
    with pytest.warns(RuntimeWarning, match="moe_gate selection kernel unavailable"):
        ops.moe_gate(h, w, b, **DSV3)
    assert len(loaded) == 2  # a reset forgets the failure: the kernel is tried again (and warns again)


def test_a_fault_in_strict_mode_raises(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    hwprofile.reset()
    ops.reset_dispatch()
    _real_gate_launch(monkeypatch, FailingKernel(RuntimeError("binding error")))
    h, w, b = inputs(3, 256)
    with pytest.raises(KernelError, match="launching the moe_gate kernel: RuntimeError: binding error"):
        ops.moe_gate(h, w, b, **DSV3)


def test_the_launch_passes_the_gate_abi(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    seen: list[tuple[Any, ...]] = []

    class Recording:
        def launch(self, launch: Any, stream: int, args: Any) -> None:
            seen.append((launch.grid, launch.block, launch.pdl, tuple(args[4:])))

    _real_gate_launch(monkeypatch, Recording())
    h, w, _ = inputs(5, 384)
    ids, weights = ops._gate.select(ops.router_gemm(h, w), None, 1, 1, 8, False, 2.827) or (None, None)
    assert ids is not None and ids.dtype == torch.int64 and weights.dtype == torch.float32 and ids.shape == (5, 8)
    (grid, block, pdl, rest), = seen
    assert grid == (5, 1, 1) and block == (32, 1, 1) and pdl
    assert rest[:6] == (5, 384, 1, 1, 8, 0) and rest[6] == pytest.approx(2.827)


def test_decide_checks_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    with pytest.raises(ValueError, match="decide_moe_gate: top_k must be an int >= 0"):
        ops.decide_moe_gate(hwprofile.profile(), m=1, n=256, top_k=-1)
    assert ops.decide_moe_gate(hwprofile.profile(), m=0, n=256, top_k=8).gate == "empty"


def test_a_call_plans_once_and_a_repeated_shape_not_at_all(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Issue 35: moe_gate planned its launch twice per call. The route and its plan are remembered per
    (device, M, N, K, n_group, topk_group, top_k): the first call plans once, the next calls of that shape never."""
    plans: list[tuple[int, int, int]] = []
    real_plan = ops._gate.plan

    def counting_plan(prof: Any, m: int, n: int, k: int, *rest: Any) -> Any:
        plans.append((m, n, k))
        return real_plan(prof, m, n, k, *rest)

    launched: list[Any] = []

    def launch(t: Any, plan: Any, x: Any, w: Any, bias: Any, m: int, n: int, k: int, n_group: int, topk_group: int, top_k: int,
               *rest: Any) -> tuple[Any, Any]:
        launched.append(plan)
        return torch.zeros(m, top_k, dtype=torch.int64), torch.zeros(m, top_k)

    monkeypatch.setattr(ops._gate, "plan", counting_plan)
    monkeypatch.setattr(ops._gate, "launch", launch)
    h, w, b = inputs(4, 256)
    ops.moe_gate(h, w, b, **DSV3)
    assert plans == [(4, 256, 64)] and len(launched) == 1
    ops.moe_gate(h, w, b, **DSV3)
    ops.moe_gate(h, w, b, **DSV3)
    assert plans == [(4, 256, 64)] and len(launched) == 3 and launched[0] is launched[1] is launched[2]
