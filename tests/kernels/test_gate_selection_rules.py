"""The fused gate's selection, as ``hwprofile/moe_gate.cuh`` writes it, picks what the torch selection picks: on the CPU.

``select_token`` in the header is transliterated below step for step (a group's score from its running top two,
the kept groups by a warp arg-max over (value, index) pairs that prefers the lower index on a tie, the picks by the
same arg-max over the experts not taken, the weight sum in pick order); a warp's butterfly reduction of such pairs
is the arg-max under that total order whatever the tree, so the sequential scan is the kernel's answer. It runs
on fp32 choice values that the torch selection also sees, with many exact ties (quantised logits, equal groups), for
every router of the op table's gate and the peers' settings, and must give the torch selection's ids exactly and
its weights to fp32 rounding. The GPU tests (tests/ops/test_moe_gate_gpu.py) hold the CUDA code to float64.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from hwprofile.optable import MOE_GATE

torch = pytest.importorskip("torch")

HEADER = Path(__file__).resolve().parents[2] / "core/src/hwprofile/include/hwprofile/moe_gate.cuh"
NEG_INF = float("-inf")
NO_INDEX = 0x7FFFFFFF


def f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def before(a: float, ia: int, b: float, ib: int) -> bool:  # moe_gate.cuh: before()
    return a > b or (a == b and ia < ib)


def kernel_select(scores: list[float], choice: list[float], n_group: int, topk_group: int, top_k: int, renorm: bool, scaling: float,
                  softmax: bool) -> tuple[list[int], list[float]]:
    """One token, as select_token does it (fp32 arithmetic where the kernel adds)."""
    n = len(choice)
    choice = list(choice)
    if n_group > 1:
        per = n // n_group
        gscore = []
        for g in range(n_group):
            b1 = b2 = NEG_INF
            for j in range(per):
                v = choice[g * per + j]
                if v > b1:
                    b2, b1 = b1, v
                elif v > b2:
                    b2 = v
            gscore.append(b1 if softmax else f32(b1 + b2))
        kept: set[int] = set()
        for _ in range(topk_group):
            v, i = NEG_INF, NO_INDEX
            for g in range(n_group):
                if g not in kept and before(gscore[g], g, v, i):
                    v, i = gscore[g], g
            kept.add(i)
        choice = [c if e // per in kept else NEG_INF for e, c in enumerate(choice)]
    taken: set[int] = set()
    ids: list[int] = []
    picked: list[float] = []
    total = 0.0
    for _ in range(top_k):
        v, i = NEG_INF, NO_INDEX
        for e in range(n):
            if e not in taken and before(choice[e], e, v, i):
                v, i = choice[e], e
        taken.add(i)
        ids.append(i)
        picked.append(scores[i])
        total = f32(total + scores[i])
    weights = []
    for w in picked:
        if renorm:
            w = f32(w / f32(total + 1e-20))
        if scaling != 1.0:
            w = f32(w * scaling)
        weights.append(w)
    return ids, weights


def logits_with_ties(m: int, n: int, seed: int, levels: int) -> Any:
    """fp32 logits on a coarse grid (many exact ties), one token all equal, one with two identical halves of groups."""
    g = torch.Generator().manual_seed(seed)
    lg = torch.randint(-levels, levels + 1, (m, n), generator=g).float() / levels * 3
    lg[0] = 0.5
    if m > 1:
        lg[1, n // 2 :] = lg[1, : n // 2]
    return lg


CASES = [(r.name, r.n, r.n_group, r.topk_group, r.top_k, r.renormalize, r.scaling, r.scoring) for r in MOE_GATE.routers] + [
    ("sglang-128", 128, 4, 2, 4, True, 1.0, "sigmoid"),
    ("vllm-512", 512, 16, 8, 16, True, 1.0, "sigmoid"),
    ("flashinfer-160", 160, 8, 3, 6, True, 16.0, "sigmoid"),
    ("softmax-groups", 256, 8, 4, 8, False, 1.0, "softmax"),
    ("softmax-groups-of-one", 32, 32, 4, 4, True, 1.0, "softmax"),
]


@pytest.mark.parametrize(("name", "n", "n_group", "topk_group", "top_k", "renorm", "scaling", "scoring"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("levels", [2, 7, 1000])
def test_the_kernels_selection_is_the_torch_selection(name: str, n: int, n_group: int, topk_group: int, top_k: int, renorm: bool,
                                                      scaling: float, scoring: str, levels: int) -> None:
    from hwprofile import ops
    from hwprofile.ops import _gate

    ops.register()
    m = 6
    lg = logits_with_ties(m, n, seed=n + levels, levels=levels)
    bias = None if scoring == "softmax" else (torch.randint(-2, 3, (n,), generator=torch.Generator().manual_seed(levels)).float() / 8)
    want_ids, want_w = _gate.select_torch(lg, bias, n_group, topk_group, top_k, renorm, scaling, scoring)
    scores = lg.softmax(-1) if scoring == "softmax" else lg.sigmoid()
    choice = scores if bias is None else scores + bias
    for row in range(m):
        ids, weights = kernel_select(scores[row].tolist(), choice[row].tolist(), n_group, topk_group, top_k, renorm, scaling,
                                     scoring == "softmax")
        assert ids == want_ids[row].tolist(), (name, row)
        for got, want in zip(weights, want_w[row].tolist(), strict=True):
            assert math.isclose(got, want, rel_tol=4e-7, abs_tol=0.0), (name, row, got, want)


def test_the_transliteration_follows_the_header() -> None:
    """The steps above are the header's: if it changes its tie rule or its group score, this test says to look again."""
    src = HEADER.read_text()
    for line in (
        "return a > b || (a == b && ia < ib);",  # before(): larger first, then the lower index
        "gscore[lane] = (a.flags & kSoftmax) ? b1 : b1 + b2;",  # a group's score: top two (softmax: the top one)
        "if (v > b1) {",
        "} else if (v > b2) {",
        "if (e < N && !((keep >> (e / per)) & 1u)) choice[e] = neg_inf();",  # other groups' experts out
        "sum += w;  // in pick order, every lane the same",
        "if (a.flags & kRenorm) w = w / (sum + 1e-20f);",
        "if (a.scaling != 1.0f) w = w * a.scaling;",
    ):
        assert line in src, line
