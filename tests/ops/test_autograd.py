"""Autograd: every op's gradients against float64, eager and compiled, on the fallback and the kernel path;
the arguments an op has no gradient for (``OpDef.grads``) are refused by name, never dropped.

The kernel path runs on the CPU through the seam of test_gates.py (``_dispatch._cpu_index`` and a fake
``_kernel.launch``); the GPU-marked test runs the real kernels.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile._env import DEVICE
from hwprofile.optable import OPS
from hwprofile.plugin import PREBUILT_SHAPES

from .reference import REFERENCES, operands
from .test_gates import FakeLauncher, fake  # noqa: F401 - the fixture, shared

torch = pytest.importorskip("torch")
ops.register()



def kernel_shape(name: str) -> tuple[int, int, int]:
    """(M, N, K) inside the op's kernel region on the simulated H200 (test_gates.py's pinned bounds)."""
    return (4, 256, 7168) if OPS[name].threshold == "max_tokens" else (1, 2048, 4096)  # M-prefix ops / the M = 1 GEMV box


def leaves(name: str, lead: tuple[int, ...], n: int, k: int) -> tuple[Any, ...]:
    """Contract operands of ``name``, the ones the op has gradients for requiring grad."""
    args = operands(OPS[name], lead, n, k)
    return tuple(a.requires_grad_(arg in OPS[name].grads) for a, arg in zip(args, OPS[name].args, strict=True))


def reference_grads(name: str, args: tuple[Any, ...], probe: Any) -> list[Any]:
    """d(sum(probe * op(args)))/d(args) through the float64 reference."""
    dbl = [a.detach().double().requires_grad_(a.requires_grad) for a in args]
    (REFERENCES[name](*dbl) * probe.double()).sum().backward()
    return [d.grad for d in dbl]


def assert_grads(name: str, fn: Any, args: tuple[Any, ...]) -> None:
    out = fn(*args)
    probe = torch.randn(out.shape)
    (out.float() * probe).sum().backward()
    for arg, a, ref in zip(OPS[name].args, args, reference_grads(name, args, probe), strict=True):
        if not a.requires_grad:
            continue
        assert a.grad is not None, f"{name}: no gradient for {arg}"
        assert a.grad.dtype == a.dtype and a.grad.shape == a.shape
        err = float((a.grad.double() - ref).norm() / ref.norm())
        assert err < 4e-3, f"{name}: gradient of {arg} off the float64 reference by {err:.2e} (relative)"


@pytest.mark.parametrize("name", list(OPS))
def test_gradients_match_float64_eagerly(name: str) -> None:
    assert_grads(name, getattr(ops, name), leaves(name, (2, 3), 24, 64))


@pytest.mark.parametrize("name", list(OPS))
def test_gradients_match_float64_compiled(name: str) -> None:
    torch._dynamo.reset()
    fn = getattr(ops, name)
    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True, backend="aot_eager")
    assert_grads(name, compiled, leaves(name, (5,), 16, 64))


@pytest.mark.parametrize("name", list(PREBUILT_SHAPES))
def test_gradients_on_the_kernel_path(fake: FakeLauncher, name: str) -> None:  # noqa: F811
    """Inside the kernel's region the kernel runs and every gradient still arrives (it used to depend on M).

    Over the ops the skinny-GEMM family computes: the simulated H200's plugin has a kernel for each (an op with a
    kernel of its own in some plugin is not assumed to have one here)."""
    m, n, k = kernel_shape(name)
    args = leaves(name, (m,), n, k)
    assert_grads(name, getattr(ops, name), args)
    assert [c[0] for c in fake.calls] == [name], f"{name}: the kernel did not run for {(m, n, k)}"


def test_no_grad_keeps_the_kernel_path_and_gives_no_graph(fake: FakeLauncher) -> None:  # noqa: F811
    h, w = leaves("router_gemm", (4,), 256, 7168)
    with torch.no_grad():
        out = ops.router_gemm(h, w)
    assert out.grad_fn is None and fake.calls == [("router_gemm", 4, 256, 7168, 0)]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("arg", ["w", "scale"])
def test_an_argument_without_a_gradient_is_refused_by_name(arg: str, compiled: bool) -> None:
    x, w, scale = operands(OPS["fp8_gemv"], (2,), 16, 64)
    {"w": w, "scale": scale}[arg].requires_grad_()
    fn = ops.fp8_gemv
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(lambda *a: ops.fp8_gemv(*a), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=rf"fp8_gemv: {arg} requires grad, but fp8_gemv has gradients for x only"):
        fn(x, w, scale)
    with torch.no_grad():  # inference with a weight that happens to require grad is fine
        assert fn(x, w, scale).shape == (2, 16)


def test_direct_custom_op_refuses_too() -> None:
    x, w, scale = operands(OPS["fp8_gemv"], (2,), 16, 64)
    with pytest.raises(ValueError, match="fp8_gemv: w requires grad"):
        torch.ops.hwprofile.fp8_gemv(x, w.requires_grad_(), scale)


def test_out_cannot_carry_gradients() -> None:
    h, w = leaves("router_gemm", (3,), 8, 64)
    with pytest.raises(ValueError, match="router_gemm: out= cannot be used when an operand requires grad"):
        ops.router_gemm(h, w, out=torch.empty(3, 8))


@pytest.mark.skipif(DEVICE.name in os.environ, reason="inductor compiles C++: once, in the leg without a simulated device")
@pytest.mark.hwprofile_per_device
def test_gradients_under_inductor() -> None:
    torch._dynamo.reset()
    try:
        torch.compile(lambda t: t.relu() + 1, fullgraph=True)(torch.ones(4))
    except Exception as exc:  # noqa: BLE001 - the machine's C++ toolchain, not these ops
        pytest.skip(f"inductor cannot build CPU code here: {type(exc).__name__}: {exc}"[:300])
    torch._dynamo.reset()
    compiled = torch.compile(lambda h, w: ops.router_gemm(h, w).sigmoid(), fullgraph=True)
    h, w = leaves("router_gemm", (4,), 16, 64)
    out = compiled(h, w)
    probe = torch.randn(out.shape)
    (out * probe).sum().backward()
    hd, wd = (t.detach().double().requires_grad_() for t in (h, w))
    ((hd @ wd.t()).sigmoid() * probe.double()).sum().backward()
    for got, ref in ((h.grad, hd.grad), (w.grad, wd.grad)):
        assert got is not None and ref is not None
        assert float((got.double() - ref).norm() / ref.norm()) < 4e-3


@pytest.mark.hwprofile_gpu("sm_90")
@pytest.mark.parametrize("name", list(OPS))
def test_gradients_on_the_gpu_kernel_path(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The real kernels in their region (strict: a kernel that cannot load fails), gradients against float64."""
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    monkeypatch.setenv("HWPROFILE_LINEAR_BF16_FP32_MAX_TOKENS", "8")  # linear has no kernel by default
    hwprofile.reset()
    ops.reset_dispatch()
    m, n, k = kernel_shape(name)
    args = tuple(a.detach().cuda().requires_grad_(a.requires_grad) for a in leaves(name, (m,), n, k))
    if ops.decide(name, hwprofile.profile(0), m=m, n=n, k=k).path != "kernel":
        pytest.skip(f"{name}: {(m, n, k)} is not in this profile's kernel region")
    before = hwprofile.profile(0).stats.counts.get(name, {}).get("kernel", 0)
    out = getattr(ops, name)(*args)
    probe = torch.randn(out.shape, device="cuda")
    (out.float() * probe).sum().backward()
    assert hwprofile.profile(0).stats.counts[name]["kernel"] == before + 1
    cpu = [a.detach().cpu().requires_grad_(a.requires_grad) for a in args]
    for arg, a, ref in zip(OPS[name].args, args, reference_grads(name, tuple(cpu), probe.cpu()), strict=True):
        if a.requires_grad:
            assert a.grad is not None, f"{name}: no gradient for {arg}"
            assert float((a.grad.double().cpu() - ref).norm() / ref.norm()) < 4e-3
    ops.reset_dispatch()


@pytest.mark.parametrize("name", list(OPS))
def test_opcheck_autograd_registration(name: str) -> None:
    """torch.library.opcheck: the autograd registration is the one torch expects of a custom op."""
    torch.library.opcheck(getattr(torch.ops.hwprofile, name).default, leaves(name, (3,), 8, 64), test_utils=("test_autograd_registration",))
