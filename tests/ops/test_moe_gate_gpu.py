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


# --- the ticket and the lane layout (moe_gate.cuh): state across calls and replays, every layout path --------------

LAYOUTS = [  # (N, n_group, topk_group, top_k): N = 64..512, groups on whole lanes and groups cut across lanes
    (64, 1, 1, 6), (128, 1, 1, 8), (160, 1, 1, 8), (256, 8, 4, 8), (384, 1, 1, 8), (512, 1, 1, 10),
    (384, 8, 4, 8),  # 12 experts a lane, 4 lanes a group
    (200, 8, 3, 8),  # groups of 25: no aligned width, one warp reduction per group
    (512, 32, 5, 32),  # 32 groups of one lane, 32 picks
    (96, 3, 2, 4),  # 8 lanes a group, 24 of the 32 lanes used
]


def gate(h: Any, w: Any, b: Any, n_group: int, topk_group: int, top_k: int, scaling: float = 1.0) -> tuple[Any, Any]:
    """The fused kernel whatever the route says (``run_kernel``: a refusal or a fault raises, never the torch path)."""
    return ops._gate.run_kernel(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, renormalize=True, scaling=scaling,
                                scoring="sigmoid")


def kernel_and_torch(m: int, n: int, n_group: int, topk_group: int, top_k: int, seed: int, k: int = 1024) -> None:
    """The kernel's ids equal the float64 selection on router_gemm's fp32 logits wherever no near-tie, weights to 1e-5."""
    h, w, b = inputs(m, n, seed=seed, k=k)
    ids, weights = gate(h, w, b, n_group, topk_group, top_k, 2.0)
    check(ids, weights, ops.router_gemm(h, w), b, n_group, topk_group, top_k, True, 2.0)


@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k"), LAYOUTS, ids=[f"N{c[0]}g{c[1]}" for c in LAYOUTS])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_every_layout_matches_float64_and_the_torch_selection(m: int, n: int, n_group: int, topk_group: int, top_k: int) -> None:
    kernel_and_torch(m, n, n_group, topk_group, top_k, seed=m * 1000 + n + n_group)


def test_the_ticket_is_zero_after_every_launch_and_repeated_calls_stay_right() -> None:
    """The last CTA's own atom.inc returns the ticket to zero: 200 calls of alternating shapes (different CTA counts) on
    one stream, each right; a left-over count would make a later launch select before its logits are stored."""
    shapes = [(1, 256, 8, 4, 8), (16, 384, 1, 1, 8), (5, 64, 1, 1, 6), (9, 512, 32, 5, 32)]
    data = {s: inputs(s[0], s[1], seed=sum(s), k=2048) for s in shapes}
    want = {}
    for s, (h, w, b) in data.items():
        _, _, g, tg, k = s
        want[s] = gate(h, w, b, g, tg, k)
        check(want[s][0], want[s][1], ops.router_gemm(h, w), b, g, tg, k, True, 1.0)
    for i in range(200):
        s = shapes[i % len(shapes)]
        h, w, b = data[s]
        got = gate(h, w, b, s[2], s[3], s[4])
        assert torch.equal(got[0], want[s][0]) and torch.equal(got[1], want[s][1]), (i, s)
    torch.cuda.synchronize()
    ws = ops._gate._workspace[0]
    assert int(ws.count_nonzero()) == 0, "a ticket word is not zero between launches"


@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k"), [(256, 8, 4, 8), (384, 1, 1, 8), (200, 8, 3, 8)])
def test_graph_replays_chain_new_inputs_and_stay_right(n: int, n_group: int, topk_group: int, top_k: int) -> None:
    """Three gates captured in one graph (PDL chains them), replayed 50 times with new hidden states between replays:
    every replay right, the ticket words zero after each."""
    m = 8
    h, w, b = inputs(m, n, seed=n, k=2048)
    outs: list[Any] = []

    def step() -> None:
        outs.clear()
        for _ in range(3):
            outs.append(gate(h, w, b, n_group, topk_group, top_k, 2.5))

    step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for i in range(50):
        h.copy_(inputs(m, n, seed=1000 + i, k=2048)[0])
        g.replay()
        torch.cuda.synchronize()
        want = gate(h, w, b, n_group, topk_group, top_k, 2.5)
        for ids, weights in outs:
            assert torch.equal(ids, want[0]) and torch.equal(weights, want[1]), i
    check(outs[0][0], outs[0][1], ops.router_gemm(h, w), b, n_group, topk_group, top_k, True, 2.5)
    assert int(ops._gate._workspace[0].count_nonzero()) == 0


@pytest.mark.parametrize("n", [64, 256, 384, 512])
def test_exact_ties_everywhere_go_to_the_lower_index(n: int) -> None:
    """Every logit equal (zero hidden state): every pick a tie, in every lane and slot; the biases lift a few experts
    (two of them equal). The torch selection, the kernel and index order agree."""
    m = 4
    h = torch.zeros(m, 256, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(n, 256, device="cuda").bfloat16()
    b = torch.zeros(n, device="cuda")
    lifted = [n - 1, n // 2, n // 2 + 1, 3]
    b[lifted] = torch.tensor([0.5, 0.25, 0.25, 0.125], device="cuda")
    n_group = 8 if n % 8 == 0 and n >= 128 else 1
    top_k = 8
    ids, weights = gate(h, w, b, n_group, n_group // 2 or 1, top_k)
    want_ids, want_w = ops._gate.select_torch(ops.router_gemm(h, w), b, n_group, n_group // 2 or 1, top_k, True, 1.0)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w, rtol=1e-6, atol=0)
    assert ids[0, :4].tolist() == [n - 1, n // 2, n // 2 + 1, 3]


@pytest.mark.parametrize("m", [17, 32, 100])
@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k", "scale"), [DSV3, KIMI], ids=["dsv3", "kimi-k2"])
def test_above_the_kernels_m_the_torch_path_is_right(m: int, n: int, n_group: int, topk_group: int, top_k: int, scale: float) -> None:
    """M > 16: the op takes its torch path (decide says so) and picks what float64 picks on the same fp32 logits."""
    d = ops.decide_moe_gate(hwprofile.profile(0), m=m, n=n, k=7168, n_group=n_group, topk_group=topk_group, top_k=top_k)
    assert d.path == "fallback", d.reason
    h, w, b = inputs(m, n, seed=13 * m + n)
    ids, weights = ops.moe_gate(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)
    check(ids, weights, torch.mm(h, w.t(), out_dtype=torch.float32), b, n_group, topk_group, top_k, True, scale)
