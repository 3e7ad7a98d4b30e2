"""Every first call inside a CUDA-graph capture is safe, on both paths and for both kinds of op (issue 33 item 3), on the CPU.

A fake capture flag and the real pipeline but for NVRTC, the driver and the launch (``conftest.seam``). A first call
whose fallback never ran in this thread (a never-initialised cuBLAS handle) or whose kernel is not loaded raises
``NotWarmedError`` naming the op and the shape before anything runs; after ``ops.warmup`` of those shapes the same
calls run inside the capture with nothing compiled or loaded there. The peer's case (FlashInfer's CUDA-graph test):
router_gemm M=3, N=32, K=1024. The GPU side, in fresh processes: tests/ops/test_capture_first_call_gpu.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from hwprofile import ops
from hwprofile.ops import _dispatch, _gate, _kernel

from .conftest import Seam

torch = pytest.importorskip("torch")

PEER = (3, 32, 1024)  # FlashInfer's first router_gemm call in a capture
PAST = (17, 32, 1024)  # past the router kernel's 16 tokens: the fallback whatever the model says
GATE_KERNEL = (4, 256, 7168)  # DeepSeek-V3's gate: the fused kernel on sm90
GATE_FALLBACK = (17, 256, 7168)  # past its 16 tokens: the torch path


def router(m: int, n: int, k: int) -> Any:
    return ops.router_gemm(torch.zeros((m, k), dtype=torch.bfloat16), torch.zeros((n, k), dtype=torch.bfloat16))


def gate(m: int, n: int, k: int) -> Any:
    h, w, b = torch.zeros((m, k), dtype=torch.bfloat16), torch.zeros((n, k), dtype=torch.bfloat16), torch.zeros(n)
    return ops.moe_gate(h, w, b, top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)


@pytest.fixture
def fallbacks_seen(seam: Seam, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every torch path that runs (router_gemm's fallback, the gate's), recorded."""
    seen: list[str] = []
    e = _dispatch.ENTRIES["router_gemm"]
    real, real_gate = e.fallback, _gate.fallback
    monkeypatch.setattr(e, "fallback", lambda *a: (seen.append("router_gemm"), real(*a))[1])
    monkeypatch.setattr(_gate, "fallback", lambda *a: (seen.append("moe_gate"), real_gate(*a))[1])
    return seen


@pytest.mark.parametrize("shape", [PEER, PAST], ids=["peer-3x32x1024", "past-the-kernel"])
def test_a_router_gemm_first_call_in_capture_is_not_warmed_on_either_path(seam: Seam, fallbacks_seen: list[str],
                                                                         shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    seam.capturing = True
    with pytest.raises(ops.NotWarmedError, match=rf"router_gemm \(M={m}, N={n}, K={k}\).*inside a CUDA-graph capture.*warmup"):
        router(*shape)
    assert not fallbacks_seen and not seam.compiles and not seam.loads and not seam.launches
    assert ("router_gemm", 0, _kernel.thread_id()) not in _kernel.fallback_ready


def test_after_warmup_both_router_gemm_paths_run_in_the_capture(seam: Seam, fallbacks_seen: list[str]) -> None:
    report = ops.warmup(shapes={"router_gemm": [PEER, PAST]})
    assert "router_gemm" in report.fallbacks and not report.failed
    compiles, loads = len(seam.compiles), len(seam.loads)
    seam.capturing = True
    fallbacks_seen.clear()
    router(*PAST)
    assert fallbacks_seen == ["router_gemm"]
    peer = ops.decide("router_gemm", _dispatch.table(0).prof, m=PEER[0], n=PEER[1], k=PEER[2])
    router(*PEER)
    if peer.path == "kernel":
        assert len(seam.launches) == 1 and fallbacks_seen == ["router_gemm"]
    else:
        assert fallbacks_seen == ["router_gemm"] * 2
    assert (len(seam.compiles), len(seam.loads)) == (compiles, loads)  # nothing compiled or loaded inside the capture


@pytest.mark.parametrize("shape", [GATE_KERNEL, GATE_FALLBACK], ids=["fused-kernel", "torch-path"])
def test_a_gate_first_call_in_capture_is_not_warmed_on_either_path(seam: Seam, fallbacks_seen: list[str],
                                                                   shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    seam.capturing = True
    with pytest.raises(ops.NotWarmedError, match=rf"moe_gate \(M={m}, N={n}, K={k}\).*inside a CUDA-graph capture"):
        gate(*shape)
    assert not fallbacks_seen and not seam.compiles and not seam.loads and not seam.launches
    assert not _gate.failed  # not warmed is not a failure: outside the capture the kernel loads as usual


def test_after_warmup_both_gate_paths_run_in_the_capture(seam: Seam, fallbacks_seen: list[str]) -> None:
    report = ops.warmup(shapes={"moe_gate": [GATE_KERNEL, GATE_FALLBACK]})
    assert "moe_gate" in report.fallbacks and report.loaded >= 1 and not report.failed
    compiles, loads = len(seam.compiles), len(seam.loads)
    seam.capturing = True
    fallbacks_seen.clear()
    ids, weights = gate(*GATE_KERNEL)
    assert ids.shape == (4, 8) and weights.dtype == torch.float32
    assert [name for name in seam.launches if "moe_gate" in name] and not fallbacks_seen  # the fused kernel, one launch
    gate(*GATE_FALLBACK)
    assert fallbacks_seen == ["moe_gate"]
    assert (len(seam.compiles), len(seam.loads)) == (compiles, loads)


def test_a_gate_kernel_shape_never_loaded_takes_its_warmed_torch_path_in_the_capture(
    seam: Seam, fallbacks_seen: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    ops.warmup(shapes={"moe_gate": [GATE_FALLBACK]})  # its torch path only
    seam.capturing = True
    fallbacks_seen.clear()
    with caplog.at_level(logging.WARNING):
        gate(*GATE_KERNEL)
        gate(*GATE_KERNEL)
    assert fallbacks_seen == ["moe_gate"] * 2 and not seam.compiles and not [x for x in seam.launches if "moe_gate" in x]
    assert caplog.text.count("inside a CUDA-graph capture") == 1 and not _gate.failed
    seam.capturing = False
    gate(*GATE_KERNEL)  # outside the capture the fused kernel loads and launches: it was never marked failed
    assert [x for x in seam.launches if "moe_gate" in x]
