"""ops.moe_gate's fused kernel on the CPU: its route (``ops.decide_moe_gate``: the kernel's limits are the only box, inside
them ``moe_gate.measured`` then ``moe_gate.model`` decide), the torch path for every shape or call it cannot take, the
launch ABI, and any fault (load, launch) falling back with one warning. Through the CPU seam of tests/ops/test_gates.py
(CPU tensors count as device 0 of a simulated H200) with :class:`GateFake` standing in for the fused kernel's launch.
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import hwprofile
from hwprofile import costmodel, ops
from hwprofile.errors import KernelError
from hwprofile.kernels import _pipeline

from .reference import moe_gate as reference
from .test_gates import FakeLauncher, fake  # noqa: F401 - the fixture, shared
from .test_launch_faults import FailingKernel

torch = pytest.importorskip("torch")
ops.register()

DSV3 = {"top_k": 8, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}
KIMI = {"top_k": 8, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827}


class GateFake:
    """Stands in for ``ops._gate.launch`` (the fused kernel: router GEMM + selection in one launch): records
    ("moe_gate", M, N, K, n_group, topk_group, top_k, the plan's instance) and returns the float64 rules' result."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, t: Any, plan: Any, x: Any, w: Any, bias: Any, m: int, n: int, k: int, n_group: int, topk_group: int,
                 top_k: int, renormalize: bool, scaling: float, scoring: str) -> tuple[Any, Any]:
        assert x.is_contiguous() and w.is_contiguous() and (x.shape, w.shape) == ((m, k), (n, k)), "the ABI takes contiguous [M, K], [N, K]"
        assert scoring == "sigmoid", "the float64 reference states the sigmoid rules"
        self.calls.append(("moe_gate", m, n, k, n_group, topk_group, top_k, plan.name_expression))
        ids, weights = reference(x.double() @ w.double().t(), bias, n_group, topk_group, top_k, renormalize, scaling)
        return ids, weights.float()


@pytest.fixture
def gate(fake: FakeLauncher, monkeypatch: pytest.MonkeyPatch) -> Iterator[GateFake]:  # noqa: F811
    """The seam of ``fake`` (whose launcher records every GEMM launch), the fused gate's launch replaced by :class:`GateFake`."""
    g = GateFake()
    monkeypatch.setattr(ops._gate, "launch", g)
    yield g


def inputs(m: int, n: int, k: int = 64) -> tuple[Any, Any, Any]:
    g = torch.Generator().manual_seed(7 * m + n)
    return (torch.randn(m, k, generator=g).bfloat16(), (torch.randn(n, k, generator=g) * k**-0.5).bfloat16(),
            torch.randn(n, generator=g) * 0.05)


def planned(m: int, n: int, k: int, kw: dict[str, Any]) -> str:
    """The instance the profile's fused-gate planner gives this call (its selection included)."""
    prof = hwprofile.profile()
    return str(prof.kernels["moe_gate"].configure(m=m, n=n, k=k, split_k=bool(prof["gemv.split_k"]), n_group=kw.get("n_group", 1),
                                                  topk_group=kw.get("topk_group", 1), top_k=kw["top_k"]).name_expression)


@pytest.mark.parametrize(("n", "kw"), [(256, DSV3), (384, KIMI)])
@pytest.mark.parametrize("m", [1, 4, 16])
def test_decode_gates_take_the_fused_kernel_in_one_launch(fake: FakeLauncher, gate: GateFake, m: int, n: int, kw: dict[str, Any]) -> None:  # noqa: F811
    h, w, b = inputs(m, n)
    ids, weights = ops.moe_gate(h, w, b, **kw)
    assert gate.calls == [("moe_gate", m, n, 64, kw["n_group"], kw["topk_group"], 8, planned(m, n, 64, kw))]
    assert fake.calls == []  # no router_gemm launch of its own: the GEMM is inside the fused kernel
    want = reference(h.double() @ w.double().t(), b, kw["n_group"], kw["topk_group"], 8, True, kw["routed_scaling_factor"])
    assert torch.equal(ids, want[0]) and torch.equal(weights, want[1].float())
    d = ops.decide_moe_gate(hwprofile.profile(), m=m, n=n, k=64, n_group=kw["n_group"], topk_group=kw["topk_group"], top_k=8)
    assert (d.path, d.gate, d.basis) == ("kernel", None, "model")  # nothing measured: sm90's bandwidth rule predicts it


@pytest.mark.parametrize(("m", "n", "kw", "gate_", "why"), [
    (17, 256, DSV3, "m", "kernel limit: M=17 > moe_gate.max_tokens=16"),
    (4, 1024, {"top_k": 8, "n_group": 8, "topk_group": 4}, "n", "kernel limit: N=1024 outside [2, 512]"),
    (4, 256, {"top_k": 8, "n_group": 64, "topk_group": 4}, "plan", "n_group = 1..32 dividing N"),
    (4, 512, {"top_k": 33}, "plan", "top_k = 1..32, got top_k=33"),
])
def test_shapes_the_kernel_cannot_take_run_the_torch_path(
    fake: FakeLauncher, gate: GateFake, m: int, n: int, kw: dict[str, Any], gate_: str, why: str  # noqa: F811
) -> None:
    h, w, b = inputs(m, n)
    ids, _ = ops.moe_gate(h, w, b, **kw)
    assert gate.calls == [] and fake.calls == []
    ref_ids, _ = reference(ops.router_gemm(h, w), b, kw.get("n_group", 1), kw.get("topk_group", 1), kw["top_k"], True,
                           kw.get("routed_scaling_factor", 1.0))
    assert ids.shape == (m, kw["top_k"]) and torch.equal(ids, ref_ids)
    d = ops.decide_moe_gate(hwprofile.profile(), m=m, n=n, k=64, n_group=kw.get("n_group", 1), topk_group=kw.get("topk_group", 1),
                            top_k=kw["top_k"])
    assert (d.path, d.gate, d.basis) == ("fallback", gate_, "limit") and why in d.reason, d.reason
    assert d.kernel_us is None and d.fallback_us is None  # a limit decided: no time was asked


def test_inside_the_limits_measured_shapes_then_the_model_decide(gate: GateFake, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's limits are the only box: inside, a shape ``moe_gate.measured`` holds takes its measured path, the others
    the path ``moe_gate.model`` predicts faster (corrected by the measured times), and decide says which decided."""
    monkeypatch.setenv("HWPROFILE_MOE_GATE_MEASURED", "4x256x64=fallback:6/5; 8x256x64=kernel:3/30")
    hwprofile.reset()
    ops.reset_dispatch()
    prof = hwprofile.profile()
    for m, path in ((4, "fallback"), (8, "kernel")):  # the bandwidth rule predicts the kernel at both: the measurement wins
        h, w, b = inputs(m, 256)
        ops.moe_gate(h, w, b, **DSV3)
        assert len(gate.calls) == (path == "kernel")
        d = ops.decide_moe_gate(prof, m=m, n=256, k=64, n_group=8, topk_group=4, top_k=8)
        assert (d.path, d.basis, d.gate) == (path, "measured", None if path == "kernel" else "measured")
        assert (d.kernel_us, d.fallback_us) == ((6.0, 5.0) if m == 4 else (3.0, 30.0)) and "measured at this shape" in d.reason
    gate.calls.clear()
    # elsewhere the model: one that predicts the fallback faster keeps the gate off its kernel; a measured kernel shape stays
    slow = "kernel=50|10:4.0; fallback=4|10:4.0; near=4; n_weight=4; samples=0"
    model = costmodel.parse("moe_gate", slow, where="this test")
    for measured in ("", "8x256x64=kernel:3/30"):
        monkeypatch.setenv("HWPROFILE_MOE_GATE_MODEL", slow)
        monkeypatch.setenv("HWPROFILE_MOE_GATE_MEASURED", measured)
        hwprofile.reset()
        ops.reset_dispatch()
        prof = hwprofile.profile()
        times = {(8, 256, 64): (3.0, 30.0)} if measured else {}
        for m in (2, 8, 16):
            d = ops.decide_moe_gate(prof, m=m, n=256, k=64, n_group=8, topk_group=4, top_k=8)
            if (m, 256, 64) in times:
                assert (d.path, d.basis) == ("kernel", "measured")  # measured wins over the model
            else:
                p = costmodel.predict(model, times, m, 256, 64)
                assert (d.path, d.gate, d.basis) == ("kernel" if p.kernel else "fallback", None if p.kernel else "model", "model")
                assert (d.kernel_us, d.fallback_us) == pytest.approx((p.kernel_us, p.fallback_us)) and "predicted" in d.reason
                assert measured or not p.kernel  # the model alone predicts the fallback at every shape
            h, w, b = inputs(m, 256)
            ops.moe_gate(h, w, b, **DSV3)
            assert len(gate.calls) == (d.path == "kernel")
            gate.calls.clear()


def test_gradients_cpu_tensors_take_the_torch_path_and_compile_keeps_the_route(gate: GateFake, monkeypatch: pytest.MonkeyPatch) -> None:
    h, w, b = inputs(4, 256)
    ops.moe_gate(h, w.clone().requires_grad_(), b, **DSV3)[1].sum().backward()  # autograd needs the torch selection's graph
    assert gate.calls == []
    with torch.no_grad():
        ops.moe_gate(h, w.clone().requires_grad_(), b, **DSV3)
    assert len(gate.calls) == 1  # no grad mode: the kernel
    monkeypatch.setattr(ops._dispatch, "_cpu_index", -1)
    ops.moe_gate(h, w, b, **DSV3)  # plain CPU tensors: no kernel at all
    assert len(gate.calls) == 1
    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)
    # traced with static shapes: a kernel route is the one custom op (one launch a step), a fallback route plain torch
    for m, kernel in ((4, True), (17, False)):
        h, w, b = inputs(m, 256)
        targets: set[str] = set()

        def backend(gm: Any, example_inputs: Any) -> Any:
            targets.update(str(nd.target) for nd in gm.graph.nodes if nd.op == "call_function")  # noqa: B023 - used at once
            return gm

        torch._dynamo.reset()
        before = len(gate.calls)
        got = torch.compile(lambda *a: ops.moe_gate(*a, **DSV3), backend=backend, fullgraph=True)(h, w, b)
        assert any("hwprofile.moe_gate" in t for t in targets) == kernel, sorted(targets)
        assert len(gate.calls) - before == kernel
        want = ops.moe_gate(h, w, b, **DSV3)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch._dynamo.reset()


def test_a_device_without_the_kernel_runs_the_torch_path(monkeypatch: pytest.MonkeyPatch, gate: GateFake) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "l40s")  # no architecture plugin serves sm_89: no fused gate
    hwprofile.reset()
    ops.reset_dispatch()
    assert "moe_gate" not in hwprofile.profile().kernels
    h, w, b = inputs(2, 256)
    ops.moe_gate(h, w, b, **DSV3)
    assert gate.calls == []
    d = ops.decide_moe_gate(hwprofile.profile(), m=2, n=256, k=64, n_group=8, topk_group=4, top_k=8)
    assert (d.path, d.gate, d.basis) == ("fallback", "no_kernel", "fixed")
    assert "no architecture plugin serves this device, so no moe_gate kernel" in d.reason


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
def test_a_fault_warns_once_then_falls_back_and_decide_says_why(gate: GateFake, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    err = KernelError("CUDA_ERROR_NO_BINARY_FOR_GPU")
    kern = FailingKernel(err)
    loaded = _real_gate_launch(monkeypatch, err if fault == "load" else kern)
    h, w, b = inputs(3, 256)
    want = ops._gate.fallback(h, w, b, 8, 4, 8, True, 2.5)
    with pytest.warns(RuntimeWarning, match=r"the moe_gate kernel is unavailable on cuda:0, using the torch path from now on: .*NO_BINARY"):
        got = ops.moe_gate(h, w, b, **DSV3)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ops.moe_gate(h, w, b, **DSV3)  # failed before: the torch path, silently
    assert torch.equal(got[0], want[0]) and len(loaded) == 1 and kern.launches == (fault == "launch")
    d = ops.decide_moe_gate(hwprofile.profile(), m=3, n=256, k=64, n_group=8, topk_group=4, top_k=8)
    assert (d.path, d.gate) == ("fallback", "failed") and "failed in this process on cuda:0" in d.reason and "NO_BINARY" in d.reason
    ops.reset_dispatch()
    hwprofile.reset()
    with pytest.warns(RuntimeWarning, match="the moe_gate kernel is unavailable"):
        ops.moe_gate(h, w, b, **DSV3)
    assert len(loaded) == 2  # a reset forgets the failure: the kernel is tried again (and warns again)


def test_a_fault_in_strict_mode_raises(gate: GateFake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    hwprofile.reset()
    ops.reset_dispatch()
    _real_gate_launch(monkeypatch, FailingKernel(RuntimeError("binding error")))
    h, w, b = inputs(3, 256)
    with pytest.raises(KernelError, match="launching the moe_gate kernel: RuntimeError: binding error"):
        ops.moe_gate(h, w, b, **DSV3)


def test_the_launch_passes_the_gate_abi(gate: GateFake, monkeypatch: pytest.MonkeyPatch) -> None:
    """(ids, weights, logits, counter, x, w, bias or null, M, N, K, n_group, topk_group, top_k, flags, scaling): ops._gate.ARG_TYPES."""
    seen: list[tuple[Any, Any]] = []

    class Recording:
        def launch(self, launch: Any, stream: int, args: Any) -> None:
            seen.append((launch, tuple(args)))

    _real_gate_launch(monkeypatch, Recording())
    assert ops._gate.ARG_TYPES == (ctypes.c_void_p,) * 7 + (ctypes.c_int,) * 7 + (ctypes.c_float,)
    h, w, b = inputs(5, 384)
    ids, weights = ops.moe_gate(h, w, top_k=8, renormalize=False, routed_scaling_factor=2.827)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32 and ids.shape == weights.shape == (5, 8)
    ops.moe_gate(h, w, b, top_k=8, scoring="softmax")
    (plan, args), (_, args2) = seen
    assert plan.name_expression == planned(5, 384, 64, {"top_k": 8}) and plan.pdl
    assert args[0] == ids.data_ptr() and args[1] == weights.data_ptr() and args[4] == h.data_ptr() and args[5] == w.data_ptr()
    assert args[6] == 0 and args2[6] == b.data_ptr()  # no bias: a null pointer
    assert args[3] and args2[3] == args[3]  # one counter word per stream, reused by the next eager launch on it
    assert args[7:14] == (5, 384, 64, 1, 1, 8, 0) and args[14] == pytest.approx(2.827)
    assert args2[13] == ops._gate.RENORM | ops._gate.SOFTMAX and args2[14] == 1.0


def test_decide_checks_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    with pytest.raises(ValueError, match="decide_moe_gate: top_k must be an int >= 0"):
        ops.decide_moe_gate(hwprofile.profile(), m=1, n=256, k=7168, top_k=-1)
    with pytest.raises(TypeError, match="'k'"):
        ops.decide_moe_gate(hwprofile.profile(), m=1, n=256, top_k=8)  # type: ignore[call-arg]  # K is the GEMM's, never assumed
    d = ops.decide_moe_gate(hwprofile.profile(), m=0, n=256, k=7168, top_k=8)
    assert (d.gate, d.basis) == ("empty", "fixed")
    assert ops.decide("moe_gate", hwprofile.profile(), m=4, n=256, k=7168) == ops.decide_moe_gate(
        hwprofile.profile(), m=4, n=256, k=7168, top_k=8)  # ops.decide: a plain top-min(8, N) selection


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


def test_above_the_kernels_m_the_eager_path_hands_the_callers_tensors_to_the_fallback(fake: FakeLauncher,  # noqa: F811
                                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43 (eager +28.7 us over the direct fallback at M = 32): past the kernel's M the op validates once and calls
    the fallback with the caller's own tensors (no reshape, copy or allocation of its own), routing a repeated shape
    by one dict lookup (no route, no plan, no table lookup)."""
    seen: list[tuple[Any, ...]] = []
    real = ops._gate.fallback

    def recording(x: Any, w: Any, bias: Any, *rest: Any) -> Any:
        seen.append((x, w, bias, *rest))
        return real(x, w, bias, *rest)

    monkeypatch.setattr(ops._gate, "fallback", recording)
    h, w, b = inputs(32, 256)
    first = ops.moe_gate(h, w, b, **DSV3)
    assert ops.decide_moe_gate(hwprofile.profile(), m=32, n=256, k=64, n_group=8, topk_group=4, top_k=8).path == "fallback"
    for name in ("route_gate", "plan", "_route_of"):
        monkeypatch.setattr(ops._gate, name, lambda *a, name=name: pytest.fail(f"{name} ran for a remembered shape"))
    monkeypatch.setattr(ops._dispatch, "table", lambda *a: pytest.fail("the dispatch table was looked up for a remembered shape"))
    again = ops.moe_gate(h, w, b, **DSV3)
    assert len(seen) == 2 and all(s[0] is h and s[1] is w and s[2] is b for s in seen)
    assert seen[1][3:] == (8, 4, 8, True, 2.5, "sigmoid")
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    want = ops._gate.select_torch(h.float() @ w.float().t(), b, 8, 4, 8, True, 2.5)  # the CPU fallback's fp32 upcast
    assert torch.equal(again[0], want[0])


@pytest.mark.parametrize("lead", [(4,), (2, 2)], ids=["2d", "3d"])
def test_compiled_kernel_route_is_the_custom_op_alone_without_copies_or_views(gate: GateFake, lead: tuple[int, ...]) -> None:
    """Issue 43 (compile 0.78-0.89x): what AOT autograd hands the compiler around the fused gate's custom op. A 2-D hidden
    state reaches the op as it is (no aten.view: the old trace reshaped it), a batched one through views only; never a
    clone, copy, contiguous or layout change of an operand or a result, and the op's outputs are contiguous."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[Any] = []

    def fw(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    m = 1
    for d in lead:
        m *= d
    h2, w, b = inputs(m, 256)
    h = h2.reshape(*lead, 64)
    torch._dynamo.reset()
    try:
        got = torch.compile(lambda *a: ops.moe_gate(*a, **DSV3), backend=aot_autograd(fw_compiler=fw), fullgraph=True)(h, w, b)
    finally:
        torch._dynamo.reset()
    (gm,) = graphs
    targets = [str(nd.target) for nd in gm.graph.nodes if nd.op == "call_function"]
    assert targets.count("hwprofile.moe_gate.default") == 1, targets
    extra = [t for t in targets if t not in ("hwprofile.moe_gate.default", "<built-in function getitem>")]
    if len(lead) == 1:
        assert extra == [], extra
    else:
        assert set(extra) <= {"aten.view.default", "aten._unsafe_view.default"}, extra
    assert len(gate.calls) == 1
    want = ops.moe_gate(h, w, b, **DSV3)
    assert got[0].is_contiguous() and got[1].is_contiguous() and got[0].shape == (*lead, 8)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
