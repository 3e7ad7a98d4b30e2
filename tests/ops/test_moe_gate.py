"""ops.moe_gate: the DeepSeek-V3 / Kimi-K2 gate step against a float64 reference written from the rules, the
transformers DeepseekV3TopkRouter rules, tie-breaking, errors, batch dims, torch.compile, gradients, the kernel
path (GEMM and selection in one fused launch, CPU seam) and the GPU.

Peer-derived settings (facts of SGLang's test_moe_fused_gate.py, vLLM's grouped-topk tests and FlashInfer's
fused routing tests): (N, n_group, topk_group, top_k) = (256, 8, 4, 8) DeepSeek-V3, (128, 4, 2, 4),
(512, 16, 8, 16), (384, 1, 1, 8) Kimi-K2, (160, 8, 3, 6) DeepSeek-V2; routed scaling 2.5 / 2.827; token counts
from 1 up. Their tolerance for weights is rtol 1e-2 / atol 1e-3 against an fp32 torch reference; ids compared
as sets. Here: ids identical (and in order) wherever the row has no near-tie, weights within 1e-5 relative.
"""

from __future__ import annotations

from typing import Any

import pytest

import hwprofile
from hwprofile import ops
from hwprofile._env import DEVICE

from .reference import decisive
from .reference import moe_gate as reference
from .test_gates import FakeLauncher, fake  # noqa: F401 - the fixture, shared
from .test_moe_gate_route import GateFake, gate  # noqa: F401 - the fixture, shared

torch = pytest.importorskip("torch")
ops.register()

PEERS = [(256, 8, 4, 8, 2.5), (128, 4, 2, 4, 1.0), (512, 16, 8, 16, 1.0), (384, 1, 1, 8, 2.827), (160, 8, 3, 6, 16.0)]


def gate_inputs(m: int, n: int, k: int = 256, lead: tuple[int, ...] | None = None, device: str = "cpu") -> tuple[Any, Any, Any]:
    """bf16 hidden and router weight at the scale of a trained router (logits of order 1), an fp32 correction bias."""
    g = torch.Generator().manual_seed(m * 1000 + n)
    h = torch.randn(*(lead or (m,)), k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * k**-0.5).bfloat16()
    b = torch.randn(n, generator=g) * 0.05
    return h.to(device), w.to(device), b.to(device)


@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k", "scale"), PEERS)
@pytest.mark.parametrize("m", [1, 7, 16, 64])
def test_matches_the_float64_reference(n: int, n_group: int, topk_group: int, top_k: int, scale: float, m: int) -> None:
    h, w, b = gate_inputs(m, n)
    ids, weights = ops.moe_gate(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32 and ids.shape == weights.shape == (m, top_k)
    logits = ops.router_gemm(h, w)
    ref_ids, ref_w = reference(logits, b, n_group, topk_group, top_k, True, scale)
    rows = decisive(logits, b, n_group, topk_group, top_k)
    assert int(rows.sum()) >= max(1, m // 2), "too few rows without a near-tie to test"
    assert torch.equal(ids[rows], ref_ids[rows])
    torch.testing.assert_close(weights[rows].double(), ref_w[rows], rtol=1e-5, atol=1e-7)


def test_float64_logits_pick_the_same_experts_where_not_tied() -> None:
    """From the bf16 operands all the way: the float64 GEMM's choice, wherever fp32 accumulation cannot flip it."""
    h, w, b = gate_inputs(16, 256, k=7168)
    ids, _ = ops.moe_gate(h, w, b, top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)
    logits64 = h.double() @ w.double().t()
    ref_ids, _ = reference(logits64, b, 8, 4, 8, True, 2.5)
    rows = decisive(logits64, b, 8, 4, 8, margin=1e-4)
    assert int(rows.sum()) >= 4 and torch.equal(ids[rows], ref_ids[rows])


def transformers_rules(logits: Any, bias: Any, n_group: int, topk_group: int, top_k: int, scale: float) -> tuple[Any, Any]:
    """DeepseekV3TopkRouter's selection as transformers states it (masked groups 0.0, unsorted top-k), in float64."""
    scores = logits.double().sigmoid()
    m, n = scores.shape
    choice = scores + bias.double()
    group = choice.view(m, n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
    gidx = torch.topk(group, k=topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group).scatter_(1, gidx, 1).unsqueeze(-1).expand(m, n_group, n // n_group).reshape(m, n)
    ids = torch.topk(choice.masked_fill(~mask.bool(), 0.0), k=top_k, dim=-1, sorted=False)[1]
    w = scores.gather(1, ids)
    return ids, w / (w.sum(dim=-1, keepdim=True) + 1e-20) * scale


@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k", "scale"), PEERS[:3])
def test_agrees_with_the_transformers_router(n: int, n_group: int, topk_group: int, top_k: int, scale: float) -> None:
    h, w, b = gate_inputs(32, n)
    ids, weights = ops.moe_gate(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)
    logits = ops.router_gemm(h, w)
    t_ids, t_w = transformers_rules(logits, b, n_group, topk_group, top_k, scale)
    rows = decisive(logits, b, n_group, topk_group, top_k)
    for r in rows.nonzero().flatten().tolist():
        order = t_ids[r].argsort()  # transformers' order is unspecified: compare by expert
        mine = ids[r].argsort()
        assert torch.equal(ids[r][mine], t_ids[r][order])
        torch.testing.assert_close(weights[r][mine].double(), t_w[r][order], rtol=1e-5, atol=1e-7)


def test_ties_go_to_the_lower_index() -> None:
    h = torch.zeros(2, 64, dtype=torch.bfloat16)
    w = torch.zeros(256, 64, dtype=torch.bfloat16)  # every logit 0: every score 0.5
    ids, weights = ops.moe_gate(h, w, top_k=8, n_group=8, topk_group=4)
    assert ids.tolist() == [list(range(8))] * 2
    torch.testing.assert_close(weights, torch.full((2, 8), 1 / 8))
    b = torch.zeros(256)
    b[[200, 40, 8]] = 1.0  # three equal winners, in groups 6, 1 and 0: those groups are kept
    ids, _ = ops.moe_gate(h, w, b, top_k=4, n_group=8, topk_group=3)
    assert ids[0].tolist() == [8, 40, 200, 0]


def test_the_bias_steers_the_choice_but_not_the_weights() -> None:
    h, w, _ = gate_inputs(4, 256)
    b = torch.zeros(256)
    b[77] = 10.0
    ids, weights = ops.moe_gate(h, w, b, top_k=8, n_group=8, topk_group=4, renormalize=False)
    assert (ids[:, 0] == 77).all()
    torch.testing.assert_close(weights[:, 0], ops.router_gemm(h, w)[:, 77].sigmoid())


def test_batch_dims_empty_and_k_zero() -> None:
    h, w, b = gate_inputs(6, 256, lead=(2, 3))
    ids, weights = ops.moe_gate(h, w, b, top_k=8, n_group=8, topk_group=4)
    flat = ops.moe_gate(h.reshape(6, -1), w, b, top_k=8, n_group=8, topk_group=4)
    assert ids.shape == (2, 3, 8) and torch.equal(ids.reshape(6, 8), flat[0]) and torch.equal(weights.reshape(6, 8), flat[1])
    ids, weights = ops.moe_gate(h[:0, 0], w, b, top_k=8, n_group=8, topk_group=4)
    assert ids.shape == weights.shape == (0, 8)
    ids, weights = ops.moe_gate(torch.zeros(1, 0, dtype=torch.bfloat16), torch.zeros(384, 0, dtype=torch.bfloat16), top_k=8)
    assert ids.tolist() == [list(range(8))]  # K = 0: every logit 0, a tie everywhere


@pytest.mark.parametrize(("kw", "match"), [
    ({"n_group": 7}, r"N=256 experts \(weight rows\) do not split into n_group=7"),
    ({"n_group": 8, "topk_group": 9}, r"topk_group=9 > n_group=8"),
    ({"n_group": 8, "topk_group": 1, "top_k": 33}, r"top_k=33 > the 32 experts of topk_group=1 groups of 32"),
    ({"n_group": 256}, r"a group's score sums its top-2 experts, so groups need >= 2 experts; got 1"),
    ({"top_k": 0}, r"top_k must be an int >= 1, got 0"),
])
def test_errors_name_the_argument(kw: dict[str, int], match: str) -> None:
    h, w, b = gate_inputs(2, 256)
    args = {"top_k": 8, **kw}
    with pytest.raises(ValueError, match=f"moe_gate: {match}"):
        ops.moe_gate(h, w, b, **args)


def test_bias_errors() -> None:
    h, w, b = gate_inputs(2, 256)
    with pytest.raises(ValueError, match=r"moe_gate: bias \(e_score_correction_bias\) must be float32 of shape \(256,\), got torch.bf"):
        ops.moe_gate(h, w, b.bfloat16(), top_k=8)
    with pytest.raises(ValueError, match="moe_gate: bias requires grad"):
        ops.moe_gate(h, w, b.requires_grad_(), top_k=8)
    with pytest.raises(ValueError, match="moe_gate: hidden must be torch.bfloat16"):
        ops.moe_gate(h.float(), w, None, top_k=8)


def test_compiled_is_plain_torch_and_equal() -> None:
    h, w, b = gate_inputs(4, 256)
    targets: set[str] = set()

    def backend(gm: Any, example_inputs: Any) -> Any:
        targets.update(str(nd.target) for nd in gm.graph.nodes if nd.op == "call_function")
        return gm

    torch._dynamo.reset()
    f = torch.compile(
        lambda *a: ops.moe_gate(*a, top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5), backend=backend, fullgraph=True
    )
    got = f(h, w, b)
    want = ops.moe_gate(h, w, b, top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not any("hwprofile" in t for t in targets), sorted(targets)


def test_gradients_of_the_weights_match_float64() -> None:
    h, w, b = gate_inputs(5, 256)
    h.requires_grad_()
    w.requires_grad_()
    ids, weights = ops.moe_gate(h, w, b, top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)
    probe = torch.randn(weights.shape)
    (weights * probe).sum().backward()
    hd, wd = (t.detach().double().requires_grad_() for t in (h, w))
    s = (hd @ wd.t()).sigmoid().gather(1, ids)
    ((s / s.sum(-1, keepdim=True) * 2.5) * probe.double()).sum().backward()
    for got, ref in ((h.grad, hd.grad), (w.grad, wd.grad)):
        assert got is not None and ref is not None
        assert float((got.double() - ref).norm() / ref.norm()) < 4e-3


def test_its_gemm_and_selection_are_one_fused_launch(fake: FakeLauncher, gate: GateFake) -> None:  # noqa: F811
    """On the simulated H200 (CPU seam) the gate at DeepSeek-V3's router shape is the fused kernel alone: no router_gemm launch."""
    h, w, b = gate_inputs(4, 256, k=7168)
    ids, weights = ops.moe_gate(h, w, b, top_k=8, n_group=8, topk_group=4)
    assert fake.calls == [] and [c[:7] for c in gate.calls] == [("moe_gate", 4, 256, 7168, 8, 4, 8)]
    ref_ids, ref_w = reference(h.double() @ w.double().t(), b, 8, 4, 8, True, 1.0)
    rows = decisive(h.double() @ w.double().t(), b, 8, 4, 8, margin=1e-5)
    assert torch.equal(ids[rows], ref_ids[rows])
    torch.testing.assert_close(weights[rows].double(), ref_w[rows], rtol=1e-5, atol=1e-7)


@pytest.mark.hwprofile_gpu("sm_90")
@pytest.mark.parametrize(("n", "n_group", "topk_group", "top_k", "scale"), [PEERS[0], PEERS[3]])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_gpu_identical_choice_to_float64(monkeypatch: pytest.MonkeyPatch, m: int, n: int, n_group: int, topk_group: int, top_k: int,
                                         scale: float) -> None:
    monkeypatch.delenv(DEVICE.name, raising=False)
    monkeypatch.setenv("HWPROFILE_STRICT", "1")
    hwprofile.reset()
    ops.reset_dispatch()
    h, w, b = gate_inputs(m, n, k=7168, device="cuda")
    ids, weights = ops.moe_gate(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)
    logits64 = h.double().cpu() @ w.double().cpu().t()
    ref_ids, ref_w = reference(logits64, b.cpu(), n_group, topk_group, top_k, True, scale)
    rows = decisive(logits64, b.cpu(), n_group, topk_group, top_k, margin=1e-4)
    assert torch.equal(ids.cpu()[rows], ref_ids[rows])
    torch.testing.assert_close(weights.cpu()[rows].double(), ref_w[rows], rtol=1e-4, atol=1e-6)


def test_the_torch_path_dispatches_no_more_ops_than_a_plain_torch_step() -> None:
    """Issue 43 (above the kernel's M the op ran slower than torch's own step, eager and in graphs): the torch path's
    grouped selection, exact ties and all, dispatches fewer aten ops than the plain top-k step an engine writes
    (bench_moe_gate.py's), and none that only moves data (no clone, copy or negation of an [M, N] mask)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    def real(names: list[str]) -> list[str]:
        return [o for o in names if not any(v in o for v in ("view", "expand", "unsqueeze", "slice", "select", "alias"))]

    m, n, n_group, per = 32, 256, 8, 32
    lg, b = torch.randn(m, n), torch.randn(n) * 0.05

    def engine_step() -> Any:  # DeepSeek-V3's step as engines write it (topk, no tie rule)
        scores = lg.sigmoid()
        choice = scores + b
        group = choice.view(m, n_group, per).topk(2, dim=-1)[0].sum(dim=-1)
        gidx = torch.topk(group, k=4, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group).scatter_(1, gidx, 1).unsqueeze(-1).expand(m, n_group, per).reshape(m, n)
        ids = torch.topk(choice.masked_fill(~mask.bool(), float("-inf")), k=8, dim=-1, sorted=False)[1]
        wt = scores.gather(1, ids)
        return ids, wt / (wt.sum(dim=-1, keepdim=True) + 1e-20) * 2.5

    with Count() as ours:
        ops._gate.select_torch(lg, b, n_group, 4, 8, True, 2.5)
    with Count() as theirs:
        engine_step()
    assert len(real(ours.ops)) < len(real(theirs.ops)), (real(ours.ops), real(theirs.ops))
    assert not [o for o in ours.ops if "clone" in o or "copy" in o or "bitwise_not" in o], ours.ops
