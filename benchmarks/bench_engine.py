"""A real client: the ops inside an engine-shaped step, eager, torch.compile and CUDA graphs, on the GPU.

Two workloads, each run with hwprofile's ops and with the plain torch calls they replace:

* DeepSeek-V3 MoE gate: hidden 7168, 256 experts: router GEMM (fp32 logits), sigmoid, top-8, for
  M = 1, 2, 4, 8, 16 tokens (hwprofile: ``ops.router_gemm``; torch: ``torch.mm(out_dtype=float32)``).
* The whole DeepSeek-V3 gate step (``ops.moe_gate``: + correction bias, grouped top-k n_group 8 /
  topk_group 4 / top-8, normalisation, scaling 2.5) against torch's step as transformers and SGLang
  write it (``torch.mm(out_dtype=float32)``, sigmoid, top-2 group sums, masked top-k, gather), M = 1..16;
  M = 32 too, where router_gemm's gates send the GEMM to its fallback (compiled: plain torch in the graph).
* A decode stack (M = 1) of 4 Llama-3-8B-shaped layers: qkv 6144x4096, o 4096x4096, gate_up
  28672x4096, down 4096x14336 (hwprofile: ``ops.gemv``, which takes its kernel where the sm90 box
  allows and cuBLAS elsewhere; torch: ``F.linear``).

Modes: ``eager`` (host loop, wall time per step), ``graph`` (one step captured with
torch.cuda.graph, replays timed with CUDA events), ``compile`` (torch.compile(fullgraph=True),
inductor, wall time per step) and ``compile+graphs`` (mode="reduce-overhead"). Microseconds per
step, median of 5 rounds; compiled rows are flagged where hwprofile is below its target (issue 33: torch.compile
>= 0.98x torch, mode="reduce-overhead" >= 1.0x). Last, the eager fallback path: each op (the gate too) at a shape
its gates send to the fallback, against the fallback called directly (target: at most +1.2 µs). Writes
engine.json to $OUT (or ./out); exit 1 when a row misses its target.
Usage: OUT=dir python3 benchmarks/bench_engine.py (``benchmarks/run_h200.sh engine``, with the wheels installed)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import hwprofile
from hwprofile import ops
from hwprofile.optable import OPS

OUT = Path(os.environ.get("OUT", "out"))
dev = torch.device("cuda:0")
torch._dynamo.config.cache_size_limit = 64
#: issue 33's targets: torch's time / hwprofile's, per compiled mode (eager and graph rows are reported, not judged)
TARGETS = {"compile": 0.98, "compile+graphs": 1.0}
#: the eager fallback path: at most this many µs over the fallback called directly
TARGET_EAGER_OVERHEAD_US = 1.2


def gate_hw(h: Any, w: Any) -> Any:
    return torch.topk(ops.router_gemm(h, w).sigmoid(), 8, dim=-1)


def gate_torch(h: Any, w: Any) -> Any:
    return torch.topk(torch.mm(h, w.t(), out_dtype=torch.float32).sigmoid(), 8, dim=-1)


def _dsv3_select(logits: Any, b: Any) -> tuple[Any, Any]:
    """torch's DeepSeek-V3 selection as transformers / SGLang write it (n_group 8, topk_group 4, top-8, scaling 2.5)."""
    m = logits.shape[0]
    scores = logits.sigmoid()
    choice = scores + b
    group = choice.view(m, 8, 32).topk(2, dim=-1)[0].sum(dim=-1)
    gidx = torch.topk(group, k=4, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group).scatter_(1, gidx, 1).unsqueeze(-1).expand(m, 8, 32).reshape(m, 256)
    ids = torch.topk(choice.masked_fill(~mask.bool(), float("-inf")), k=8, dim=-1, sorted=False)[1]
    w = scores.gather(1, ids)
    return ids, w / (w.sum(dim=-1, keepdim=True) + 1e-20) * 2.5


def moe_gate_hw(h: Any, w: Any, b: Any) -> Any:
    return ops.moe_gate(h, w, b, top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)


def moe_gate_torch(h: Any, w: Any, b: Any) -> Any:
    return _dsv3_select(torch.mm(h, w.t(), out_dtype=torch.float32), b)


def stack(linear: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def step(x: Any, *ws: Any) -> Any:
        for i in range(0, len(ws), 4):
            qkv = linear(x, ws[i])
            o = linear(qkv[:, :4096], ws[i + 1])
            gu = linear(o, ws[i + 2])
            x = linear(gu[:, :14336], ws[i + 3])
        return x

    return step


def wall(fn: Callable[[], Any], steps: int = 200) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e6


def graph(fn: Callable[[], Any], reps: int = 50) -> float:
    """Median µs of one CUDA-graph replay of ``fn`` (the sweep's replay timer, after extra warm-up for compiled code)."""
    from hwprofile.sweep import replay_times

    for _ in range(2):
        fn()
    return statistics.median(replay_times(lambda _i: fn(), 1, reps, torch.cuda.current_device()))


def measure(
    name: str, impls: dict[str, Callable[..., Any]], args: tuple[Any, ...], rows: list[dict[str, Any]], modes: tuple[str, ...]
) -> None:
    for mode in modes:
        res: dict[str, float] = {}
        for impl, fn in impls.items():
            torch._dynamo.reset()
            if mode == "eager":
                res[impl] = statistics.median(wall(lambda f=fn: f(*args)) for _ in range(5))
            elif mode == "graph":
                res[impl] = statistics.median(graph(lambda f=fn: f(*args)) for _ in range(3))
            elif mode == "compile":
                c = torch.compile(fn, fullgraph=True)
                res[impl] = statistics.median(wall(lambda f=c: f(*args)) for _ in range(5))
            else:
                c = torch.compile(fn, fullgraph=True, mode="reduce-overhead")
                res[impl] = statistics.median(wall(lambda f=c: f(*args)) for _ in range(5))
        ratio = res["torch"] / res["hwprofile"]
        target = TARGETS.get(mode)
        below = target is not None and ratio < target
        rows.append({"workload": name, "mode": mode, **{f"{k}_us": v for k, v in res.items()}, "ratio": ratio, "target": target,
                     "below_target": below})
        print(
            f"{name:22s} {mode:15s} hwprofile {res['hwprofile']:8.2f} us   torch {res['torch']:8.2f} us   "
            f"x{ratio:4.2f}{f'   BELOW {target}' if below else ''}",
            flush=True,
        )


def eager_overhead(rows: list[dict[str, Any]]) -> None:
    """Each op at a shape routed to its fallback: the op against its fallback called directly (wall µs, median of 5)."""
    k = 7168
    x32 = torch.randn(32, k, device=dev).bfloat16()
    w = torch.randn(256, k, device=dev).bfloat16()
    w8 = (torch.randn(256, k, device=dev) * 2).to(torch.float8_e4m3fn)
    s = torch.tensor([0.5], device=dev)
    prof = hwprofile.profile(0)
    for op, d in OPS.items():  # M = 32: above every op's kernel region on the sm90 profile (decide() says, per row)
        args = (x32, w8, s) if d.scaled else (x32, w)
        dec = ops.decide(op, prof, m=args[0].shape[0], n=args[1].shape[0], k=k)
        fn, fb = getattr(ops, op), ops.fallback(op)
        t_op = statistics.median(wall(lambda f=fn, a=args: f(*a), 2000) for _ in range(5))
        t_fb = statistics.median(wall(lambda f=fb, a=args: f(*a), 2000) for _ in range(5))
        over = t_op - t_fb > TARGET_EAGER_OVERHEAD_US
        rows.append({"workload": f"eager fallback {op}", "mode": "eager", "op_us": t_op, "fallback_us": t_fb, "path": dec.path,
                     "below_target": over})
        print(
            f"eager fallback {op:18s} op {t_op:7.2f} us   fallback {t_fb:7.2f} us   +{t_op - t_fb:5.2f} us"
            f"{f'   OVER +{TARGET_EAGER_OVERHEAD_US}' if over else ''}  ({dec.path}: {dec.reason})",
            flush=True,
        )
    # the gate kind: DeepSeek-V3's gate at M = 32 (past the fused kernel's 16 tokens) against its torch path called directly
    b = torch.randn(256, device=dev) * 0.05
    dec = ops.decide_moe_gate(prof, m=32, n=256, k=k, n_group=8, topk_group=4, top_k=8)
    gate_args = (8, 4, 8, True, 2.5)
    t_op = statistics.median(wall(lambda: ops.moe_gate(x32, w, b, top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5), 2000)
                             for _ in range(5))
    t_fb = statistics.median(wall(lambda: ops._gate.fallback(x32, w, b, *gate_args), 2000) for _ in range(5))
    over = t_op - t_fb > TARGET_EAGER_OVERHEAD_US
    rows.append({"workload": "eager fallback moe_gate", "mode": "eager", "op_us": t_op, "fallback_us": t_fb, "path": dec.path,
                 "below_target": over})
    print(f"eager fallback {'moe_gate':18s} op {t_op:7.2f} us   fallback {t_fb:7.2f} us   +{t_op - t_fb:5.2f} us"
          f"{f'   OVER +{TARGET_EAGER_OVERHEAD_US}' if over else ''}  ({dec.path}: {dec.reason})", flush=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("bench_engine.py: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    hwprofile.reset()
    prof = hwprofile.profile(0)
    print(
        f"device: {prof.device.name}, plugin {prof.plugin.label if prof.plugin else None}, torch {torch.__version__}, "
        f"fingerprint {prof.fingerprint}"
    )
    rows: list[dict[str, Any]] = []
    w = torch.randn(256, 7168, device=dev).bfloat16()
    torch._dynamo.mark_static_address(w)  # a weight, as a module parameter would be: CUDA-graph trees must not copy it per step
    for m in (1, 2, 4, 8, 16):
        h = torch.randn(m, 7168, device=dev).bfloat16()
        print(f"  gate M={m}: {ops.decide('router_gemm', prof, m=m, n=256, k=7168).reason}")
        modes = ("eager", "graph", "compile", "compile+graphs") if m in (1, 4, 16) else ("eager", "graph")  # compiling costs seconds
        measure(f"dsv3 gate M={m}", {"hwprofile": gate_hw, "torch": gate_torch}, (h, w), rows, modes)
    b = torch.randn(256, device=dev) * 0.05
    torch._dynamo.mark_static_address(b)
    for m in (1, 2, 4, 8, 16, 32):
        h = torch.randn(m, 7168, device=dev).bfloat16()
        modes = ("eager", "graph", "compile", "compile+graphs") if m in (1, 4, 16, 32) else ("eager", "graph")
        measure(f"dsv3 moe_gate M={m}", {"hwprofile": moe_gate_hw, "torch": moe_gate_torch}, (h, w, b), rows, modes)
    shapes = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)] * 4
    ws = [torch.randn(n, k, device=dev).bfloat16() * 0.02 for n, k in shapes]
    for t in ws:
        torch._dynamo.mark_static_address(t)
    for n, k in shapes[:4]:
        print(f"  decode {n}x{k}: {ops.decide('gemv', prof, m=1, n=n, k=k).reason}")
    x = torch.randn(1, 4096, device=dev).bfloat16()
    measure(
        "decode stack 4 layers",
        {"hwprofile": stack(ops.gemv), "torch": stack(F.linear)},
        (x, *ws),
        rows,
        ("eager", "graph", "compile", "compile+graphs"),
    )
    eager_overhead(rows)
    (OUT / "engine.json").write_text(
        json.dumps({"device": prof.device.name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1)
    )
    below = [r for r in rows if r.get("below_target")]
    for r in below:
        print(f"FAIL {r['workload']} {r['mode']}")
    print(f"{'PASS' if not below else 'FAIL'}: {len(below)} row(s) miss their target (compile >= 0.98x, compile+graphs >= 1.0x torch, "
          f"eager fallback <= +{TARGET_EAGER_OVERHEAD_US} us)")
    return 1 if below else 0


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    sys.exit(main())
