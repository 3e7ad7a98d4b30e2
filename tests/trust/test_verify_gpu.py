"""Verification on first use on the GPU in hand (skipped cleanly without one): every op's real kernel instances pass
against float64 on their first call, their verdicts stored; a real instance launched wrong on purpose (K halved: it
reads half of every row) fails, is disabled with one warning naming it, and the op's result stays right."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import _verdicts, ops
from hwprofile.optable import OPS

pytestmark = pytest.mark.hwprofile_gpu()
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.delenv("HWPROFILE_VERIFY", raising=False)
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    hwprofile.reset()
    ops.reset_dispatch()
    if not hwprofile.profile(0).kernels:
        pytest.skip(f"{hwprofile.profile(0).device.name}: no architecture plugin with kernels serves it")


def kernel_shapes(op: str) -> list[tuple[int, int, int]]:
    prof = hwprofile.profile(0)
    d = OPS[op]
    shapes = dict.fromkeys(s for s in (*d.grid, *d.prebuilt) if all(s) and s[1] * s[2] <= (32 << 20))
    return [s for s in shapes if ops.decide(op, prof, m=s[0], n=s[1], k=s[2]).path == "kernel"]


def operands(op: str, m: int, n: int, k: int) -> tuple[Any, Any, Any]:
    d = OPS[op]
    x = torch.randn(m, k, device="cuda").to(getattr(torch, d.x_dtype))
    w = (torch.randn(n, k, device="cuda") * (16 if d.scaled else 1)).to(getattr(torch, d.w_dtype))
    s = (torch.rand(n, device="cuda") + 0.5) if d.scaled else None
    return x, w, s


def call(op: str, x: Any, w: Any, s: Any) -> Any:
    fn = getattr(ops, op)
    return fn(x, w) if s is None else fn(x, w, s)


@pytest.mark.parametrize("op", list(OPS))
def test_real_instances_pass_on_first_use_and_are_stored(op: str) -> None:
    shapes = kernel_shapes(op)[:3]
    if not shapes:
        pytest.skip(f"no shape of {op}'s grid routes to its kernel on this device")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for shape in shapes:
            x, w, s = operands(op, *shape)
            y = call(op, x, w, s)
            ref = x.double() @ (w.double() * (s.double().reshape(-1, 1) if s is not None else 1)).t()
            assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    have = _verdicts.read(_verdicts.path_for(hwprofile.profile(0)))
    mine = {v.shape for v in have.values() if v.op == op}
    assert set(shapes) <= mine and all(v.ok for v in have.values()), have


def test_an_instance_launched_wrong_is_disabled_and_the_op_stays_right(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwprofile.kernels import launch as klaunch

    shapes = kernel_shapes("gemv")
    if not shapes:
        pytest.skip("no gemv shape routes to the kernel here")
    real = klaunch.LoadedKernel.launch

    def halved(self: Any, plan: Any, stream: int, args: Any) -> None:
        a = list(args)
        a[-1] //= 2
        real(self, plan, stream, tuple(a))

    monkeypatch.setattr(klaunch.LoadedKernel, "launch", halved)
    x, w, _ = operands("gemv", *shapes[0])
    with pytest.warns(RuntimeWarning, match="gemv kernel disabled on cuda:0 .*failed verification against float64") as got:
        y = ops.gemv(x, w)
    assert len(got) == 1
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w))
    assert ops.decide("gemv", hwprofile.profile(0), m=shapes[0][0], n=shapes[0][1], k=shapes[0][2]).gate == "failed"
