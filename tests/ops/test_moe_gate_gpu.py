"""ops.moe_gate's fused kernel (router GEMM + selection, one launch) on an sm_90 GPU (skipped without one):
identical expert ids and weights within 1e-5
relative of the float64 rules on the same fp32 logits (1e-4 from the bf16 operands, where the GEMM's rounding counts),
for the DeepSeek-V3 and Kimi-K2 settings (and the peers' others) at M = 1..16, inside a CUDA graph, without a bias,
unnormalised, and after a GEMM that took cuBLAS. Strict mode: a kernel fault is an error.
"""

from __future__ import annotations

from typing import Any

import pytest

import hwprofile
from hwprofile import ops

from .reference import decisive
from .reference import moe_gate as reference

pytestmark = pytest.mark.hwprofile_gpu("sm_90")
torch = pytest.importorskip("torch")

DSV3, KIMI = (256, 8, 4, 8, 2.5), (384, 1, 1, 8, 2.827)
OTHERS = [(128, 4, 2, 4, 1.0), (512, 16, 8, 16, 1.0), (160, 8, 3, 6, 16.0)]  # SGLang / vLLM / FlashInfer test settings


@pytest.fixture(autouse=True)
def strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPROFILE_DEVICE", raising=False)
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    monkeypatch.setenv("HWPROFILE_DISABLE_PLUGINS", "myengine")
    hwprofile.reset()
    ops.reset_dispatch()


def inputs(m: int, n: int, seed: int, k: int = 7168) -> tuple[Any, Any, Any]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(m, k, generator=g).bfloat16().cuda()
    w = (torch.randn(n, k, generator=g) * k**-0.5).bfloat16().cuda()
    return h, w, (torch.randn(n, generator=g) * 0.05).cuda()


def takes_kernel(m: int, n: int, n_group: int, topk_group: int, top_k: int, k: int = 7168) -> None:
    d = ops.decide_moe_gate(hwprofile.profile(0), m=m, n=n, k=k, n_group=n_group, topk_group=topk_group, top_k=top_k)
    assert d.path == "kernel", d.reason


def check(ids: Any, weights: Any, logits: Any, bias: Any, n_group: int, topk_group: int, top_k: int, renorm: bool,
          scale: float) -> None:
    """ids identical and weights within 1e-5 relative of the float64 rules on the same fp32 logits, wherever no near-tie."""
    lg, b = logits.cpu(), None if bias is None else bias.cpu()
    ref_ids, ref_w = reference(lg, b, n_group, topk_group, top_k, renorm, scale)
    rows = decisive(lg, b, n_group, topk_group, top_k, margin=1e-6)
    assert int(rows.sum()) >= max(1, (3 * lg.shape[0]) // 4), "too few rows without a near-tie"
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids.cpu()[rows], ref_ids[rows])
    torch.testing.assert_close(weights.cpu()[rows].double(), ref_w[rows], rtol=1e-5, atol=0)


@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k", "scale"), [DSV3, KIMI], ids=["dsv3", "kimi-k2"])
@pytest.mark.parametrize("m", range(1, 17))
def test_kernel_matches_float64_on_its_logits(m: int, n: int, n_group: int, topk_group: int, top_k: int, scale: float) -> None:
    takes_kernel(m, n, n_group, topk_group, top_k)
    h, w, b = inputs(m, n, seed=100 * m + n)
    ids, weights = ops.moe_gate(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)
    assert ops._gate._loaded and not ops._gate.failed  # the selection ran as the kernel
    check(ids, weights, ops.router_gemm(h, w), b, n_group, topk_group, top_k, True, scale)


@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k", "scale"), [DSV3, KIMI], ids=["dsv3", "kimi-k2"])
@pytest.mark.parametrize("m", [1, 4, 8, 16])
def test_whole_step_matches_float64_from_the_bf16_operands(m: int, n: int, n_group: int, topk_group: int, top_k: int, scale: float) -> None:
    h, w, b = inputs(m, n, seed=7 * m + n)
    ids, weights = ops.moe_gate(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)
    logits64 = h.double().cpu() @ w.double().cpu().t()
    ref_ids, ref_w = reference(logits64, b.cpu(), n_group, topk_group, top_k, True, scale)
    rows = decisive(logits64, b.cpu(), n_group, topk_group, top_k, margin=1e-4)
    assert int(rows.sum()) >= 1
    assert torch.equal(ids.cpu()[rows], ref_ids[rows])
    # the fp32 GEMM's rounding (K = 7168), not the selection, bounds this one (the selection: 1e-5, above)
    torch.testing.assert_close(weights.cpu()[rows].double(), ref_w[rows], rtol=1e-4, atol=0)


@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k", "scale"), OTHERS)
@pytest.mark.parametrize("m", [1, 5, 16])
def test_peer_settings(m: int, n: int, n_group: int, topk_group: int, top_k: int, scale: float) -> None:
    """N = 512: the fused kernel's GEMM against router_gemm's cuBLAS logits (near-ties excepted by ``check``)."""
    takes_kernel(m, n, n_group, topk_group, top_k)
    h, w, b = inputs(m, n, seed=m + 3 * n)
    ids, weights = ops.moe_gate(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)
    check(ids, weights, ops.router_gemm(h, w), b, n_group, topk_group, top_k, True, scale)


@pytest.mark.parametrize("renorm", [True, False])
def test_without_bias_and_unnormalised(renorm: bool) -> None:
    h, w, _ = inputs(6, 256, seed=11)
    ids, weights = ops.moe_gate(h, w, None, top_k=8, n_group=8, topk_group=4, renormalize=renorm)
    check(ids, weights, ops.router_gemm(h, w), None, 8, 4, 8, renorm, 1.0)


def test_ties_go_to_the_lower_index() -> None:
    h = torch.zeros(2, 64, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(256, 64, dtype=torch.bfloat16, device="cuda")  # every score 0.5
    b = torch.zeros(256, device="cuda")
    b[[200, 40, 8]] = 1.0
    ids, _ = ops.moe_gate(h, w, b, top_k=4, n_group=8, topk_group=3)
    assert ops._gate._loaded
    assert ids.cpu().tolist() == [[8, 40, 200, 0]] * 2
    ids, weights = ops.moe_gate(h, w, top_k=8, n_group=8, topk_group=4)
    assert ids.cpu().tolist() == [list(range(8))] * 2
    torch.testing.assert_close(weights.cpu(), torch.full((2, 8), 1 / 8))


@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k", "scale"), [DSV3, KIMI], ids=["dsv3", "kimi-k2"])
def test_cuda_graph_replay(n: int, n_group: int, topk_group: int, top_k: int, scale: float) -> None:
    h, w, b = inputs(8, n, seed=5)

    def step() -> Any:
        return ops.moe_gate(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)

    step()  # loads the fused kernel and its counter workspace outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ids, weights = step()
    h.copy_(inputs(8, n, seed=6)[0])
    g.replay()
    torch.cuda.synchronize()
    want = step()
    assert torch.equal(ids, want[0]) and torch.equal(weights, want[1])
    check(ids, weights, ops.router_gemm(h, w), b, n_group, topk_group, top_k, True, scale)


@pytest.mark.parametrize("router", [r.name for r in ops._gate.MOE_GATE.routers])
@pytest.mark.parametrize("m", [1, 7, 16])
def test_every_served_router_against_float64_and_the_torch_selection(router: str, m: int) -> None:
    """Every router of the op table's gate entry (sigmoid and softmax, 64..512 experts, K 2048..7168): one launch,
    ids equal to the torch selection on the fused kernel's own GEMM (router_gemm's kernel where it takes the shape),
    weights within 1e-4 of float64 from the bf16 operands."""
    r = next(x for x in ops._gate.MOE_GATE.routers if x.name == router)
    takes_kernel(m, r.n, r.n_group, r.topk_group, r.top_k, r.k)
    h, w, b = inputs(m, r.n, seed=31 * m + r.n, k=r.k)
    b = b if r.scoring == "sigmoid" else None
    ids, weights = ops.moe_gate(h, w, b, top_k=r.top_k, n_group=r.n_group, topk_group=r.topk_group, renormalize=r.renormalize,
                                routed_scaling_factor=r.scaling, scoring=r.scoring)
    assert ops._gate._loaded and not ops._gate.failed
    assert ids.shape == (m, r.top_k) and ids.dtype == torch.int64 and weights.dtype == torch.float32
    logits64 = h.double().cpu() @ w.double().cpu().t()
    want_ids, want_w = ops._gate.select_torch(logits64, None if b is None else b.cpu().double(), r.n_group, r.topk_group, r.top_k,
                                              r.renormalize, r.scaling, r.scoring)
    # rows whose k-th and (k+1)-th choices are within the fp32 GEMM's rounding are near-ties: either order is right
    scores = logits64.softmax(-1) if r.scoring == "softmax" else logits64.sigmoid()
    choice = (scores + (0 if b is None else b.cpu().double())).sort(-1, descending=True).values
    rows = (choice[:, r.top_k - 1] - choice[:, r.top_k]) > 1e-4 if r.n_group == 1 else torch.ones(m, dtype=torch.bool)
    if r.n_group == 1:
        assert torch.equal(ids.cpu()[rows], want_ids[rows])
        torch.testing.assert_close(weights.cpu()[rows].double(), want_w[rows], rtol=1e-4, atol=0)
    if r.renormalize:
        torch.testing.assert_close(weights.sum(-1).cpu().double(), torch.full((m,), r.scaling, dtype=torch.float64), rtol=1e-5, atol=0)
