"""torch.library custom ops: registration is lazy, opcheck passes, torch.compile(fullgraph=True) traces every op."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile._env import DEVICE
from hwprofile.optable import OPS

from .reference import REFERENCES

torch = pytest.importorskip("torch")
ops.register()  # hwprofile.ops may have been imported before torch (then nothing is bound yet): bind now

K = 64


def bf16(*shape: int) -> Any:
    return torch.randn(*shape).bfloat16()


def args_for(op: str, lead: tuple[int, ...] = (3,), n: int = 24, k: int = K) -> tuple[Any, ...]:
    x = bf16(*lead, k)
    if OPS[op].scaled:
        return x, (torch.randn(n, k) * 2).to(torch.float8_e4m3fn), torch.rand(n) + 0.5
    return x, bf16(n, k)


def test_custom_ops_are_registered_with_the_op_table_names() -> None:
    for name in OPS:
        assert hasattr(torch.ops.hwprofile, name)


@pytest.mark.parametrize("op", list(OPS))
def test_opcheck(op: str) -> None:
    """torch.library.opcheck: schema, fake implementation and dispatcher registrations agree with the real one."""
    custom = getattr(torch.ops.hwprofile, op).default
    # test_schema compares inputs with a multiply torch lacks for float8 on the CPU: not for fp8_gemv
    utils = (
        ("test_faketensor", "test_aot_dispatch_static")
        if OPS[op].scaled
        else ("test_schema", "test_faketensor", "test_aot_dispatch_static")
    )
    torch.library.opcheck(custom, args_for(op), test_utils=utils)


@pytest.mark.parametrize("op", list(OPS))
def test_compile_fullgraph_aot_eager(op: str) -> None:
    torch._dynamo.reset()
    fn = getattr(ops, op)

    def f(*a: Any) -> Any:
        return fn(*a).float().softmax(-1)

    a = args_for(op, lead=(2, 3))
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*a), f(*a))


def test_compile_with_out_and_dynamic_shapes() -> None:
    torch._dynamo.reset()

    def f(h: Any, w: Any, out: Any) -> Any:
        ops.router_gemm(h, w, out=out)
        return out.topk(2, dim=-1).indices

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    for m in (1, 5, 16):
        h, w = bf16(m, K), bf16(32, K)
        out = torch.empty(m, 32)
        assert torch.equal(compiled(h, w, out), f(h, w, torch.empty(m, 32)))
        assert torch.allclose(out, h.float() @ w.float().t(), atol=1e-3)


def test_compiled_graph_still_dispatches_to_the_kernel(monkeypatch: pytest.MonkeyPatch, no_downstream: None) -> None:
    """Under torch.compile the custom op runs the real routing: inside the measured region the kernel runs."""
    monkeypatch.setenv("HWPROFILE_DEVICE", "h200")
    hwprofile.reset()
    ops.reset_dispatch()
    calls = []

    def fake(t: Any, op: str, out: Any, x: Any, w: Any, scale: Any, m: int, n: int, k: int, mode: int, split_k: bool | None = None) -> bool:
        calls.append((op, m, n, k))
        out.copy_(REFERENCES[op](x, w).to(out.dtype))  # the op's own float64 truth, not a product assumed for every op
        return True

    monkeypatch.setattr(ops._dispatch, "_cpu_index", 0)
    monkeypatch.setattr(ops._kernel, "launch", fake)
    torch._dynamo.reset()
    compiled = torch.compile(lambda h, w: ops.router_gemm(h, w) * 2, fullgraph=True, backend="aot_eager")
    h, w = bf16(4, 7168), bf16(256, 7168)
    calls.clear()
    out = compiled(h, w)
    assert calls == [("router_gemm", 4, 256, 7168)]
    assert torch.allclose(out, 2 * REFERENCES["router_gemm"](h, w).float())
    ops.reset_dispatch()


def test_compile_errors_name_the_argument() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda h, w: ops.router_gemm(h, w), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="router_gemm: weight must be torch.bfloat16"):
        compiled(bf16(2, K), torch.randn(8, K))


@pytest.mark.skipif(
    DEVICE.name in os.environ, reason="inductor compiles C++ (~15 s on 2 cores): once per CI run, in the leg without a simulated device"
)
@pytest.mark.hwprofile_per_device  # its skipif reads the session device: runs in the leg without one
def test_compile_inductor() -> None:
    torch._dynamo.reset()
    try:  # inductor's CPU code needs a working C++ compiler; that belongs to the machine, not to these ops
        torch.compile(lambda t: t.relu() + 1, fullgraph=True)(torch.ones(4))
    except Exception as exc:  # noqa: BLE001 - any failure of the plain function means the toolchain
        pytest.skip(f"inductor cannot build CPU code on this machine, even without hwprofile: {type(exc).__name__}: {exc}"[:300])
    torch._dynamo.reset()

    def f(x: Any, w: Any, s: Any) -> Any:
        return ops.fp8_gemv(x, w, s).float().relu() + 1

    a = args_for("fp8_gemv", lead=(1,))
    # the fallback route is plain torch in the graph now, and inductor fuses the bf16 result's
    # rounding away (its default, as for any torch code): equal up to one bf16 rounding
    assert torch.allclose(torch.compile(f, fullgraph=True)(*a), f(*a), rtol=2.0**-8, atol=0)


def _run(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != DEVICE.name}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


def test_registration_is_lazy_and_works_when_the_first_lookup_is_traced() -> None:
    code = (
        "import sys\n"
        "import hwprofile, hwprofile.ops as ops\n"
        "print('torch' in sys.modules)\n"
        "import torch\n"
        "f = torch.compile(lambda h, w: ops.router_gemm(h, w).softmax(-1), fullgraph=True, backend='aot_eager')\n"
        "h, w = torch.randn(3, 64).bfloat16(), torch.randn(16, 64).bfloat16()\n"
        "print(bool(torch.allclose(f(h, w), (h.float() @ w.float().t()).softmax(-1), atol=1e-5)))\n"
    )
    assert _run(code).split() == ["False", "True"]


def test_the_custom_op_runs_for_real_inside_a_compile_session() -> None:
    """Inductor's constant folding and backends that run their graph call the op's implementation while
    ``torch.compiler.is_compiling()`` is True: it must compute there, not hand the call back to itself."""
    torch._dynamo.reset()
    x, w = torch.randn(2, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    ref = ops.gemv(x, w)

    def backend(gm: Any, example_inputs: Any) -> Any:
        gm(*example_inputs)  # as a validating or benchmarking backend does
        return gm

    f = torch.compile(lambda a, b: ops.gemv(a, b) * 2, backend=backend, fullgraph=True)
    assert torch.equal(f(x, w), ref * 2)
    session = getattr(torch.compiler, "_compile_session_context", None)
    if session is not None:  # torch >= 2.9: the flag stays set for the whole session
        with session():
            assert torch.compiler.is_compiling() and torch.equal(torch.ops.hwprofile.gemv(x, w), ref)
