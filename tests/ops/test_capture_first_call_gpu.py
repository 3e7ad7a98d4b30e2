"""Every first call inside a CUDA-graph capture is safe (issue 33), on a GPU, each case in a fresh process (skipped without one).

A process's first call of an op inside a capture, on its torch fallback (cuBLAS never initialised in
that thread) or on a kernel never loaded, raises NotWarmedError naming the op and the shape before
anything reaches the stream, and the device stays usable; after ``ops.warmup`` of the same shapes the
capture records the step and its replay equals the eager result. The peer case (FlashInfer's):
router_gemm M=3, N=32, K=1024, a fallback shape.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.hwprofile_gpu("sm_90")
pytest.importorskip("torch")

PRELUDE = """
import torch, hwprofile
from hwprofile import ops
dev = torch.device("cuda:0")
def capture(fn):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out
"""


def run(body: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("HWPROFILE_DEVICE", "HWPROFILE_STRICT")}
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.parametrize(("call", "shape"), [
    ("ops.router_gemm(x, w)", "(3, 32, 1024)"),  # the peer case: router_gemm's fallback (N=32 is outside its kernel's box)
    ("ops.gemv(x[:1], w)", "(1, 32, 1024)"),
])
def test_first_fallback_call_in_capture_is_not_warmed_then_warmup_makes_it_capture(call: str, shape: str) -> None:
    op = call.split("(")[0].split(".")[1]
    out = run(f"""
        x = torch.randn(3, 1024, device=dev).bfloat16(); w = torch.randn(32, 1024, device=dev).bfloat16()
        try:
            capture(lambda: {call})
        except ops.NotWarmedError as e:
            assert "{op}" in str(e) and "inside a CUDA-graph capture" in str(e), e
            print("not-warmed")
        torch.cuda.synchronize()
        y = (x @ x.t()).sum().item()  # the device and the stream still work
        ops.warmup(shapes={{"{op}": [{shape}]}})
        g, res = capture(lambda: {call})
        x.copy_(torch.randn_like(x)); g.replay(); torch.cuda.synchronize()
        torch.testing.assert_close(res, {call})
        print("captured")
    """)
    assert out.split() == ["not-warmed", "captured"]


def test_first_moe_gate_call_in_capture_is_not_warmed_then_warmup_captures_the_fused_kernel() -> None:
    out = run("""
        x = torch.randn(4, 7168, device=dev).bfloat16(); w = (torch.randn(256, 7168, device=dev) * 0.01).bfloat16()
        b = torch.randn(256, device=dev) * 0.05
        step = lambda: ops.moe_gate(x, w, b, top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)
        try:
            capture(step)
        except ops.NotWarmedError as e:
            assert "moe_gate (M=4, N=256, K=7168)" in str(e), e
            print("not-warmed")
        torch.cuda.synchronize()
        rep = ops.warmup(shapes={"moe_gate": [(4, 256, 7168)]})
        assert rep.loaded >= 1 and not rep.failed, rep
        loads = hwprofile.profile(0).stats.kernel_counts()
        g, (ids, wts) = capture(step)
        assert hwprofile.profile(0).stats.kernel_counts() == loads  # nothing compiled or loaded in the capture
        for seed in range(3):
            x.copy_(torch.randn_like(x)); g.replay(); torch.cuda.synchronize()
            want = step()
            assert torch.equal(ids, want[0]) and torch.equal(wts, want[1])
        print("captured")
    """)
    assert out.split() == ["not-warmed", "captured"]


def test_fp8_fallbacks_first_large_call_in_capture_records_the_split_path_after_a_small_warmup() -> None:
    """A warm-up of small FP8 weights alone settles the split path's probe: a first large call inside the capture then
    records torch._scaled_mm (what eager runs), not the dequantising path, and the replay equals the eager result."""
    out = run("""
        from hwprofile.ops import _fallbacks
        x = torch.randn(32, 4096, device=dev).bfloat16()  # M = 32: fp8_gemv's fallback (its kernels take M <= 16)
        w = (torch.randn(8192, 4096, device=dev) * 0.5).to(torch.float8_e4m3fn)  # 32 MiB: the split path's size
        s = torch.rand(8192, device=dev) + 0.5
        ops.warmup(shapes={"fp8_gemv": [(32, 64, 64)]})
        print("split" if _fallbacks._fp8_split.get(0) is not None else "dequant")
        g, res = capture(lambda: ops.fp8_gemv(x, w, s))
        x.copy_(torch.randn_like(x)); g.replay(); torch.cuda.synchronize()
        assert torch.equal(res, ops.fp8_gemv(x, w, s))
        print("captured")
    """)
    assert out.split() == ["split", "captured"]
