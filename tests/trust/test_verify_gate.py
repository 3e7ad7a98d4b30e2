"""Verification on first use of the fused gate (CPU): its check against float64 logits and the torch selection of the
kernel's own logits, run with gate "kernels" written in torch, right and wrong the ways a selection goes wrong."""

from __future__ import annotations

from typing import Any

import pytest

from hwprofile.ops import _gate
from hwprofile.optable import MOE_GATE

torch = pytest.importorskip("torch")
_gate.bind(torch)

#: every served router of the op table's gate: (N, K, n_group, topk_group, top_k)
ROUTERS = [(r.n, r.k, r.n_group, r.topk_group, r.top_k) for r in MOE_GATE.routers]


def gate(bug: str = "") -> Any:
    def run(ids: Any, weights: Any, logits: Any, x: Any, w: Any, b: Any, *, n_group: int, topk_group: int, top_k: int, flags: int,
            scaling: float) -> None:
        lg = x.float() @ w.float().t()
        if bug == "bf16_logits":
            lg = lg.to(torch.bfloat16).float()
        logits.copy_(lg)
        scoring = "softmax" if flags & _gate.SOFTMAX else "sigmoid"
        i, wt = _gate.select_torch(lg, b, n_group, topk_group, top_k, bool(flags & _gate.RENORM), scaling, scoring)
        if bug == "ties_to_higher":  # the higher of two tied experts: flip to the partner where the partner ties
            partner = i ^ 1
            tied = (lg.gather(1, i) == lg.gather(1, partner)) & (i % 2 == 0)
            i = torch.where(tied, partner, i)
        if bug == "no_renorm":
            wt = lg.sigmoid().gather(1, i) * scaling
        ids.copy_(i)
        weights.copy_(wt)

    return run


def check(run: Any, n: int, k: int, n_group: int, topk_group: int, top_k: int, m: int = 4, flags: int = _gate.RENORM) -> Any:
    def launch(ids: Any, weights: Any, logits: Any, x: Any, w: Any, b: Any) -> None:
        run(ids, weights, logits, x, w, b, n_group=n_group, topk_group=topk_group, top_k=top_k, flags=flags, scaling=2.5)

    return _gate.check_instance(launch, x_device=-1, m=m, n=n, k=k, n_group=n_group, topk_group=topk_group, top_k=top_k, flags=flags,
                                scaling=2.5, with_bias=True)


@pytest.mark.parametrize("router", ROUTERS, ids=lambda r: f"{r[0]}x{r[1]}g{r[2]}")
@pytest.mark.parametrize("m", [1, 16])
def test_a_right_gate_passes_both_input_sets(router: tuple[int, ...], m: int) -> None:
    res = check(gate(), *router, m=m)
    assert res.ok, res.error


@pytest.mark.parametrize("bug, words", [("bf16_logits", "logits relative error"), ("ties_to_higher", "ties inputs: ids of token"),
                                        ("no_renorm", "weights relative error")])
def test_a_wrong_gate_fails_naming_what(bug: str, words: str) -> None:
    res = check(gate(bug), 256, 7168, 8, 4, 8)
    assert not res.ok and words in res.error, res.error


def test_a_gate_that_writes_nothing_fails() -> None:
    res = check(lambda *a, **kw: None, 256, 1024, 8, 4, 8)
    assert not res.ok and "NaN" in res.error


@pytest.mark.parametrize("ok", [True, False])
def test_warm_up_verifies_each_gate_instance_with_the_served_routers_selection(ok: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture after ``ops.warmup`` finds the gate's verdict (found on the H100: warm-up loaded the kernel, the capture then
    refused it for want of a verdict): warm-up verifies each instance as a first eager call would, outside any capture."""
    calls: list[tuple[Any, ...]] = []
    plan = object()
    monkeypatch.setattr(_gate, "route_gate", lambda t, m, n, k, *sel: (None, plan, "kernel"))
    monkeypatch.setattr(_gate, "_kernel_for", lambda t, p, capturing: "kern")
    monkeypatch.setattr(_gate, "_counter", lambda t, device, stream, capturing: 64)
    monkeypatch.setattr(_gate._kernel, "raw_stream", lambda index: 7)

    def verified_here(t: Any, p: Any, kern: Any, counter: int, stream: int, args: tuple[Any, ...], with_bias: bool,
                      capturing: bool) -> bool:
        calls.append((p, kern, counter, stream, args, with_bias, capturing))
        return ok

    monkeypatch.setattr(_gate, "_verified_here", verified_here)
    table = type("T", (), {"index": 0, "strict": False})()
    ready, failed = _gate.warm(table, "cuda:0", [(4, 256, 7168), (2, 128, 4096)])  # type: ignore[arg-type]
    dsv3, qwen = MOE_GATE.router_for(256, 7168), MOE_GATE.router_for(128, 4096)
    assert calls == [
        (plan, "kern", 64, 7, (4, 256, 7168, dsv3.n_group, dsv3.topk_group, dsv3.top_k, _gate.RENORM, dsv3.scaling), True, False),
        (plan, "kern", 64, 7, (2, 128, 4096, qwen.n_group, qwen.topk_group, qwen.top_k, _gate.RENORM | _gate.SOFTMAX, qwen.scaling),
         False, False),
    ]  # the flags a call with each router's selection computes (selection_flags), so its verdict is the one found
    assert [c[4][6] for c in calls] == [_gate.selection_flags(r.renormalize, r.scoring) for r in (dsv3, qwen)]
    assert (ready, failed) == ((2, []) if ok else (0, ["moe_gate M=4 N=256 K=7168 (failed verification)",
                                                       "moe_gate M=2 N=128 K=4096 (failed verification)"]))


@pytest.mark.parametrize("strict", [False, True])
def test_a_fault_while_warm_up_verifies_is_that_instances_failure_not_an_escape(strict: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch or driver error in the verification launch (out of memory, say) ends as launch() ends it: one warning and
    the torch path, or in strict mode a KernelError naming warm-up, never a bare RuntimeError out of ``ops.warmup``."""
    from hwprofile.errors import KernelError

    monkeypatch.setattr(_gate, "route_gate", lambda t, m, n, k, *sel: (None, object(), "kernel"))
    monkeypatch.setattr(_gate, "_kernel_for", lambda t, p, capturing: "kern")
    monkeypatch.setattr(_gate, "_counter", lambda t, device, stream, capturing: 64)
    monkeypatch.setattr(_gate._kernel, "raw_stream", lambda index: 7)

    def oom(*args: Any) -> bool:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(_gate, "_verified_here", oom)
    monkeypatch.setattr(_gate, "failed", {})
    table = type("T", (), {"index": 5, "strict": strict})()
    if strict:
        with pytest.raises(KernelError, match="warming the moe_gate kernel: RuntimeError: CUDA out of memory"):
            _gate.warm(table, "cuda:5", [(4, 256, 7168)])  # type: ignore[arg-type]
        return
    with pytest.warns(RuntimeWarning, match="moe_gate kernel is unavailable on cuda:5.*CUDA out of memory"):
        assert _gate.warm(table, "cuda:5", [(4, 256, 7168)]) == (0, ["moe_gate M=4 N=256 K=7168"])  # type: ignore[arg-type]
    assert "out of memory" in _gate.failed[5]
