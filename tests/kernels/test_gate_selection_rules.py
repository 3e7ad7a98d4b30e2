"""The fused gate's selection, as ``hwprofile/moe_gate.cuh`` writes it, picks what the torch selection picks: on the CPU.

``select_token`` in the header is transliterated below step for step: the warp's lane-contiguous layout (lane l holds
experts l*S .. l*S+S-1, S from ``layout``: groups of whole lanes where a power-of-two lane count fits, else
ceil(N / 32)), each arg-max as the kernel takes it (the maximum of an order-preserving 32-bit key over the lanes,
the lowest lane holding it, the lowest slot of that lane), a group's score from running top twos merged over its
lanes (or per group over the warp), the weight sum in pick order. It runs on fp32 choice values that the torch
selection also sees, with many exact ties (quantised logits, equal groups), for every router of the op table's gate
and the peers' settings, and must give the torch selection's ids exactly and its weights to fp32 rounding. The GPU
tests (tests/ops/test_moe_gate_gpu.py) hold the CUDA code to float64.
"""

from __future__ import annotations

import itertools
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from hwprofile.kernels.gate_plan import MAX_N_BUCKETS
from hwprofile.optable import MOE_GATE

torch = pytest.importorskip("torch")

HEADER = Path(__file__).resolve().parents[2] / "core/src/hwprofile/include/hwprofile/moe_gate.cuh"
NEG_INF = float("-inf")
WARP = 32


def f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def order_key(v: float) -> int:  # moe_gate.cuh: order_key()
    b: int = struct.unpack("<I", struct.pack("<f", v + 0.0))[0]
    return max((~b & 0xFFFFFFFF) if b & 0x80000000 else (b | 0x80000000), 1)


def layout(n: int, n_group: int, slots: int) -> tuple[int, int]:  # moe_gate.cuh: layout()
    if n_group > 1:
        per = n // n_group
        lpg = 1
        while n_group * lpg <= WARP:
            if per % lpg == 0 and per // lpg <= slots:
                return per // lpg, lpg
            lpg *= 2
    return -(-n // WARP), 0


def top2_push(v: float, b1: float, b2: float) -> tuple[float, float]:
    if v > b1:
        return v, b1
    if v > b2:
        return b1, v
    return b1, b2


def warp_argmax(keys: list[list[int]]) -> tuple[int, int]:
    """(lane, slot) of the kernel's pick: each lane's largest key at its lowest slot, then the lowest lane holding the max."""
    best_per_lane = []
    for lane_keys in keys:
        bk, bs = 0, 0
        for s, k in enumerate(lane_keys):
            if k > bk:
                bk, bs = k, s
        best_per_lane.append((bk, bs))
    best = max(bk for bk, _ in best_per_lane)
    owner = next(lane for lane, (bk, _) in enumerate(best_per_lane) if bk == best)
    return owner, best_per_lane[owner][1]


def group_scores(choice: list[float], n_group: int, s_width: int, lpg: int, softmax: bool) -> list[float]:
    n = len(choice)
    per = n // n_group
    lanes = [[choice[lane * s_width + s] for s in range(s_width) if lane * s_width + s < n] for lane in range(WARP)]
    out = []
    for g in range(n_group):
        b1 = b2 = NEG_INF
        if lpg > 0:  # the group's lanes, each a running top two, merged (values only: any merge order gives the same pair)
            for lane in range(g * lpg, (g + 1) * lpg):
                c1 = c2 = NEG_INF
                for v in lanes[lane]:
                    c1, c2 = top2_push(v, c1, c2)
                b1, b2 = top2_push(c1, b1, b2)
                b1, b2 = top2_push(c2, b1, b2)
        else:
            for lane in range(WARP):
                for s, v in enumerate(lanes[lane]):
                    if (lane * s_width + s) // per == g:
                        b1, b2 = top2_push(v, b1, b2)
        out.append(b1 if softmax else f32(b1 + b2))
    return out


def kernel_select(scores: list[float], choice: list[float], n_group: int, topk_group: int, top_k: int, renorm: bool, scaling: float,
                  softmax: bool, max_n: int) -> tuple[list[int], list[float]]:
    """One token, as select_token does it (fp32 arithmetic where the kernel adds)."""
    n = len(choice)
    s_width, lpg = layout(n, n_group, max_n // WARP)
    choice = list(choice)
    if n_group > 1:
        per = n // n_group
        gkeys = [[order_key(v)] for v in group_scores(choice, n_group, s_width, lpg, softmax)] + [[0]] * (WARP - n_group)
        kept = set()
        for _ in range(topk_group):
            g, _slot = warp_argmax(gkeys)
            kept.add(g)
            gkeys[g] = [0]
        choice = [c if e // per in kept else NEG_INF for e, c in enumerate(choice)]
    keys = [[order_key(choice[lane * s_width + s]) if lane * s_width + s < n else 0 for s in range(s_width)] for lane in range(WARP)]
    ids: list[int] = []
    picked: list[float] = []
    total = 0.0
    for _ in range(top_k):
        lane, slot = warp_argmax(keys)
        keys[lane][slot] = 0
        e = lane * s_width + slot
        ids.append(e)
        picked.append(scores[e])
        total = f32(total + scores[e])
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
    ("kimi-8-groups", 384, 8, 4, 8, True, 2.827, "sigmoid"),  # 12 experts a lane, 4 lanes a group
    ("odd-groups-across-lanes", 200, 8, 3, 8, True, 1.0, "sigmoid"),  # groups of 25: no aligned width, per-group reductions
    ("odd-groups-softmax", 500, 4, 2, 12, False, 1.0, "softmax"),
    ("thirty-two-groups", 512, 32, 5, 32, True, 1.0, "sigmoid"),
]


@pytest.mark.parametrize(("n", "n_group", "max_n", "want"), [
    (256, 8, 256, (8, 4)), (384, 1, 512, (12, 0)), (384, 8, 512, (12, 4)), (200, 8, 256, (7, 0)), (160, 8, 256, (5, 4)),
    (64, 1, 64, (2, 0)), (512, 32, 512, (16, 1)), (32, 32, 64, (1, 1)),
])
def test_the_layout_keeps_groups_on_whole_lanes_where_it_can(n: int, n_group: int, max_n: int, want: tuple[int, int]) -> None:
    assert layout(n, n_group, max_n // WARP) == want
    s_width, lpg = want
    assert s_width <= max_n // WARP and s_width * WARP >= n  # every expert has a slot
    if lpg:
        assert n_group * lpg <= WARP and s_width * lpg == n // n_group


def test_the_order_key_orders_as_the_float_compare() -> None:
    vals = [NEG_INF, -3.5, -1e-30, -0.0, 0.0, 1e-30, 0.25, 1.0, 7e30, float("inf")]
    keys = [order_key(v) for v in vals]
    assert keys[3] == keys[4]  # -0.0 == +0.0
    distinct = keys[:4] + keys[5:]  # -0.0 stands for both zeros
    assert all(a < b for a, b in itertools.pairwise(distinct))
    assert min(keys) >= 1  # 0 stays the empty slot


@pytest.mark.parametrize(("name", "n", "n_group", "topk_group", "top_k", "renorm", "scaling", "scoring"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("levels", [2, 7, 1000])
def test_the_kernels_selection_is_the_torch_selection(name: str, n: int, n_group: int, topk_group: int, top_k: int, renorm: bool,
                                                      scaling: float, scoring: str, levels: int) -> None:
    from hwprofile import ops
    from hwprofile.ops import _gate

    ops.register()
    m = 6
    max_n = next(b for b in MAX_N_BUCKETS if n <= b)  # the plan's MAX_N bucket (gate_plan.check_gate)
    lg = logits_with_ties(m, n, seed=n + levels, levels=levels)
    bias = None if scoring == "softmax" else (torch.randint(-2, 3, (n,), generator=torch.Generator().manual_seed(levels)).float() / 8)
    want_ids, want_w = _gate.select_torch(lg, bias, n_group, topk_group, top_k, renorm, scaling, scoring)
    scores = lg.softmax(-1) if scoring == "softmax" else lg.sigmoid()
    choice = scores if bias is None else scores + bias
    for row in range(m):
        ids, weights = kernel_select(scores[row].tolist(), choice[row].tolist(), n_group, topk_group, top_k, renorm, scaling,
                                     scoring == "softmax", max_n)
        assert ids == want_ids[row].tolist(), (name, row)
        for got, want in zip(weights, want_w[row].tolist(), strict=True):
            # the sum of the picks adds in pick order, torch's in its own tree: 32 picks drift by more than 8 do
            assert math.isclose(got, want, rel_tol=4e-7 if top_k <= 8 else 2e-6, abs_tol=0.0), (name, row, got, want)


def test_the_transliteration_follows_the_header() -> None:
    """The steps above are the header's: if it changes its tie rule or its group score, this test says to look again."""
    src = HEADER.read_text()
    for line in (
        "return max((b & 0x80000000u) ? ~b : (b | 0x80000000u), 1u);",  # order_key
        "if (per % lpg == 0 && per / lpg <= SLOTS) return Layout{per / lpg, lpg};",  # layout
        "return Layout{(N + kWarp - 1) / kWarp, 0};",
        "const float mine = top1 ? b1 : b1 + b2;",  # a group's score: top two (softmax: the top one)
        "if (lane == g) gs = top1 ? b1 : b1 + b2;",
        "if (v > b1) {",
        "} else if (v > b2) {",
        "const int owner = __ffs(__ballot_sync(kFull, bk == best)) - 1;",  # the lowest lane holding the maximum
        "if (key[s] > bk) {",  # its lowest slot
        "const int g = __ffs(__ballot_sync(kFull, gk == best)) - 1;",  # the lowest group
        "my_id = owner * S + slot;",
        "sum += w;  // in pick order, every lane the same",
        "if (a.flags & kRenorm) w = w / (sum + 1e-20f);",
        "if (a.scaling != 1.0f) w = w * a.scaling;",
    ):
        assert line in src, line
