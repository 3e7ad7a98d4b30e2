"""The whole MoE gate step as one op (``ops.moe_gate``: router GEMM, then the selection kernel) against torch's step, on the GPU.

Graph replay (one step captured with torch.cuda.graph, replays timed with CUDA events: the sweep's
timer), microseconds per step, median of 3 rounds, at M = 1, 4, 8, 16 tokens, hidden 7168:

* DeepSeek-V3: 256 experts, n_group 8, topk_group 4, top-8, scaling 2.5, correction bias; torch's step
  is bench_engine.py's (``torch.mm(out_dtype=float32)``, sigmoid, top-2 group sums, masked top-k,
  gather, normalise, scale), and bench_engine.py's plain gate step (GEMM, sigmoid, top-8; 26-28 µs on
  the H200 before this kernel) is timed beside it;
* Kimi-K2: 384 experts, one group, top-8, scaling 2.827, correction bias.

Target (issue 24): hwprofile at least 3x faster than torch's step at every M. Each row also checks
that the op's ids equal the torch selection's on the same logits and prints both routes
(``ops.decide`` for the GEMM, ``ops.decide_moe_gate`` for the selection). Writes moe_gate.json to $OUT
(or ./out). Usage: OUT=dir python3 benchmarks/bench_moe_gate.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_engine import gate_torch, graph, moe_gate_torch

import hwprofile
from hwprofile import ops

OUT = Path(os.environ.get("OUT", "out"))
dev = torch.device("cuda:0")
TARGET = 3.0
SETTINGS = {  # name: (N, n_group, topk_group, top_k, routed_scaling_factor)
    "dsv3": (256, 8, 4, 8, 2.5),
    "kimi-k2": (384, 1, 1, 8, 2.827),
}


def kimi_torch(h: Any, w: Any, b: Any) -> Any:
    """torch's Kimi-K2 step: fp32 logits, sigmoid, + bias for the choice, top-8, unbiased weights normalised, scaled."""
    scores = torch.mm(h, w.t(), out_dtype=torch.float32).sigmoid()
    ids = torch.topk(scores + b, k=8, dim=-1, sorted=False)[1]
    wt = scores.gather(1, ids)
    return ids, wt / (wt.sum(dim=-1, keepdim=True) + 1e-20) * 2.827


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    print(f"device: {prof.device.name}, plugin {prof.plugin.label if prof.plugin else None}, torch {torch.__version__}")
    rows: list[dict[str, Any]] = []
    for name, (n, n_group, topk_group, top_k, scale) in SETTINGS.items():
        w = (torch.randn(n, 7168, device=dev) * 7168**-0.5).bfloat16()
        b = torch.randn(n, device=dev) * 0.05

        def hw(h: Any, w: Any = w, b: Any = b, n_group: int = n_group, topk_group: int = topk_group, top_k: int = top_k,
               scale: float = scale) -> Any:
            return ops.moe_gate(h, w, b, top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)

        torch_step = moe_gate_torch if name == "dsv3" else kimi_torch
        for m in (1, 4, 8, 16):
            h = torch.randn(m, 7168, device=dev).bfloat16()
            gemm = ops.decide("router_gemm", prof, m=m, n=n, k=7168)
            sel = ops.decide_moe_gate(prof, m=m, n=n, n_group=n_group, topk_group=topk_group, top_k=top_k)
            ids, _ = hw(h)
            ref = ops._fallbacks.grouped_topk(ops.router_gemm(h, w), b, n_group, topk_group, top_k, True, scale)[0]
            same = bool(torch.equal(ids, ref))
            t_hw = statistics.median(graph(lambda h=h: hw(h)) for _ in range(3))
            t_torch = statistics.median(graph(lambda h=h: torch_step(h, w, b)) for _ in range(3))
            t_plain = statistics.median(graph(lambda h=h: gate_torch(h, w)) for _ in range(3)) if name == "dsv3" else None
            ratio = t_torch / t_hw
            row = {"setting": name, "m": m, "hwprofile_us": t_hw, "torch_us": t_torch, "torch_plain_gate_us": t_plain,
                   "ratio": ratio, "below_target": ratio < TARGET, "ids_equal_torch_selection": same,
                   "gemm_route": gemm.path, "selection_route": sel.path, "selection_reason": sel.reason}
            rows.append(row)
            plain = f"   plain gate {t_plain:6.2f} us (x{t_plain / t_hw:4.2f})" if t_plain is not None else ""
            print(f"{name:8s} M={m:<3d} graph  hwprofile {t_hw:6.2f} us   torch {t_torch:6.2f} us   x{ratio:4.2f}"
                  f"{'   BELOW 3x' if ratio < TARGET else ''}{plain}   ids {'==' if same else '!='} torch   "
                  f"(GEMM: {gemm.path}; selection: {sel.path})", flush=True)
    (OUT / "moe_gate.json").write_text(
        json.dumps({"device": prof.device.name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
