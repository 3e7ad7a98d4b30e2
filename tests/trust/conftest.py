"""The CPU seam of the verification tests (fixture ``seam``): a simulated device whose CPU tensors route as device 0, a kernel
pipeline whose ``load`` hands out a *host kernel* (it reads the operands through their data pointers and computes
in torch on the CPU, right or wrong on purpose), and verification turned on for simulated devices."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile.kernels import _pipeline
from hwprofile.kernels.spec import Launch
from hwprofile.optable import OPS

torch = pytest.importorskip("torch")

#: a cost model (``<op>.model``, trend only) that predicts the kernel faster at every shape
KERNEL_FASTER = "kernel=0|10:100; fallback=50|10:0.01; near=0; n_weight=4; samples=2"


def view(ptr: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """A CPU tensor over the memory at ``ptr`` (what a kernel sees of an operand)."""
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    return torch.frombuffer(buf, dtype=dtype).view(shape)


def right(out: Any, x: Any, w: Any) -> Any:
    return x.float() @ w.float().t()


@dataclass
class HostKernel:
    """A loaded kernel computing ``result(out, x, w)`` on the host; counts launches per name expression."""

    op: str
    result: Callable[[Any, Any, Any], Any] = right
    launches: list[str] = field(default_factory=list)

    def launch(self, plan: Launch, stream: int, args: Any) -> None:
        d = OPS[self.op]
        out_p, x_p, w_p, _s, m, n, k = args
        self.launches.append(plan.name_expression)
        x = view(x_p, (m, k), getattr(torch, d.x_dtype))
        w = view(w_p, (n, k), getattr(torch, d.w_dtype))
        out = view(out_p, (m, n), getattr(torch, d.out_dtype))
        got = self.result(out, x, w)
        if got is not None:
            out.copy_(got)


@dataclass
class Seam:
    config: Path
    kernels: dict[str, HostKernel] = field(default_factory=dict)
    loads: list[str] = field(default_factory=list)
    capturing: bool = False

    def kernel(self, op: str, result: Callable[[Any, Any, Any], Any] = right) -> HostKernel:
        self.kernels[op] = HostKernel(op, result)
        return self.kernels[op]


@pytest.fixture
def seam(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_downstream: None) -> Iterator[Seam]:
    s = Seam(tmp_path / "config")
    monkeypatch.setenv("HWPROFILE_DEVICE", "rtx-pro-6000")
    monkeypatch.setenv("HWPROFILE_CONFIG_DIR", str(s.config))
    for op in OPS:
        monkeypatch.setenv(f"HWPROFILE_{op.upper()}_MODEL", KERNEL_FASTER)
    monkeypatch.delenv("HWPROFILE_VERIFY", raising=False)
    monkeypatch.delenv("HWPROFILE_STRICT", raising=False)
    hwprofile.reset()
    ops.reset_dispatch()
    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)
    monkeypatch.setattr(ops._kernel, "raw_stream", lambda index: 0)
    monkeypatch.setattr(ops._kernel, "_capturing", lambda index: s.capturing)
    monkeypatch.setattr(ops._verify, "on_simulated", True)

    def load(spec: Any, target: str, plan: Launch, index: int, arg_types: Any, **kw: Any) -> Any:
        s.loads.append(plan.name_expression)
        return s.kernels[_op_of(spec)]

    def loaded(spec: Any, target: str, plan: Launch, index: int, arg_types: Any) -> Any:
        return s.kernels[_op_of(spec)]

    monkeypatch.setattr(_pipeline, "load", load)
    monkeypatch.setattr(_pipeline, "loaded", loaded)
    yield s
    ops.reset_dispatch()
    hwprofile.reset()


def _op_of(spec: Any) -> str:
    prof = hwprofile.profile(0)
    return next(op for op, sp in prof.kernels.items() if sp is spec)
