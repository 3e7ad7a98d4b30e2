"""check_agreement over the job's process group: its cost when ranks agree, and every fault case, per rank.

    torchrun --standalone --nproc-per-node 2 benchmarks/nccl_agreement.py                      # two GPUs, NCCL
    HWPROFILE_DEVICE=h200 torchrun --standalone --nproc-per-node 2 benchmarks/nccl_agreement.py --backend gloo   # CPU

1. Cost: per iteration, round-robin, each timed on its own: ``allgather32`` (one 32-byte
   ``all_gather_into_tensor``; NCCL: then a device synchronize) and ``check`` (``check_agreement()``
   when every rank agrees, the profile already resolved). Rank 0 prints the medians of the slowest
   rank and the ratio check / allgather32 (issue 27's target: at most 2x).
2. Faults, in this order, each with ``timeout=--timeout`` (default 2 s): ``another_setting`` (rank 1
   sets HWPROFILE_ROUTER_GEMM_MAX_TOKENS=3), ``other_argument`` (rank 1 passes mixed='allow'),
   ``failing_profile`` (rank 1 asks for device 99), ``late`` (rank 1 calls --timeout + 1 s late),
   ``recovered`` (every rank agrees again, then one all_reduce: nothing of the faults is left in
   flight), and ``dies`` (rank 1 leaves the job before calling; it exits 0 so that torchrun keeps the
   other ranks running, as a crashed rank looks to its peers). Every rank prints one line per case:
   the verdict, the seconds it took and the first line of the message; after each case but the last,
   rank 0 prints whether every rank reached the same verdict.

Every case must end on every rank with the same verdict within about the timeout. ``--json DIR``
writes ``DIR/<rank>.json`` with the numbers and verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

VERDICTS = ("agree", "raised", "error")  # AgreementError is "raised"; any other exception is "error" (a bug)


def cost(args: argparse.Namespace, dev: Any, rank: int, world: int, cuda: bool, doc: dict[str, Any]) -> None:
    """1. check_agreement's cost when ranks agree, against one 32-byte all-gather; into ``doc``, printed by rank 0."""
    import torch
    import torch.distributed as dist

    from hwprofile import distributed as hd

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    # --- 1. cost when ranks agree ----------------------------------------------------------------------
    inp, out = torch.zeros(32, dtype=torch.uint8, device=dev), torch.empty(32 * world, dtype=torch.uint8, device=dev)
    gather_one = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13

    def allgather32() -> None:
        gather_one(out, inp)
        sync()

    t = time.perf_counter()
    hd.check_agreement()
    doc["first_check_ms"] = (time.perf_counter() - t) * 1e3
    variants: dict[str, Callable[[], object]] = {"allgather32": allgather32, "check": hd.check_agreement}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(args.warmup + args.iters):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    mine = torch.tensor([med["allgather32"], med["check"]], dtype=torch.float64, device=dev)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    worst = {"allgather32": max(float(e[0]) for e in every), "check": max(float(e[1]) for e in every)}
    doc.update(median_ms=med, median_ms_worst_rank=worst, ratio=worst["check"] / worst["allgather32"])
    if rank == 0:
        print(f"{args.backend}, {world} ranks, {args.iters} iterations: median ms of the slowest rank", flush=True)
        print(f"  allgather32  {worst['allgather32']:8.3f}\n  check        {worst['check']:8.3f}", flush=True)
        first = doc["first_check_ms"]
        print(f"  check / allgather32 = {doc['ratio']:.2f}x (target <= 2x); first check_agreement {first:.1f} ms", flush=True)


def faults(args: argparse.Namespace, dev: Any, rank: int, world: int, doc: dict[str, Any]) -> NoReturn:
    """2. The fault cases in order, each verdict compared across ranks; rank 1 leaves before ``dies``, every rank ends in ``os._exit``."""
    import torch
    import torch.distributed as dist

    import hwprofile
    from hwprofile import distributed as hd

    T = args.timeout
    odd = rank == 1
    base_env = dict(os.environ)

    def case(name: str, kwargs: dict[str, Any], env: dict[str, str] | None = None, sleep: float = 0.0) -> str:
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update(env or {})
        hwprofile.reset()
        time.sleep(sleep)
        t0 = time.perf_counter()
        try:
            a = hd.check_agreement(timeout=T, **kwargs)
            verdict, text = "agree", a.describe()
        except hwprofile.AgreementError as exc:
            verdict, text = "raised", str(exc)
        except Exception as exc:  # noqa: BLE001 - printed: a case must end in one of the two above
            verdict, text = "error", f"{type(exc).__name__}: {exc}"
        took = time.perf_counter() - t0
        first = text.splitlines()[0] if text else ""
        print(f"rank {rank}  {name:<16} {verdict:<7} {took:7.3f} s  {first[:220]}", flush=True)
        doc.setdefault("cases", {})[name] = {"verdict": verdict, "seconds": took, "message": text}
        return verdict

    def same(name: str, verdict: str) -> None:
        code = torch.tensor([VERDICTS.index(verdict)], dtype=torch.int64, device=dev)
        codes = [torch.empty_like(code) for _ in range(world)]
        dist.all_gather(codes, code)
        got = [VERDICTS[int(c.item())] for c in codes]
        if rank == 0:
            print(f"  {name}: {'the same verdict on every rank' if len(set(got)) == 1 else 'DIFFERENT verdicts'}: {got}", flush=True)

    plain: dict[str, Any] = {}
    same("another_setting", case("another_setting", plain, {"HWPROFILE_ROUTER_GEMM_MAX_TOKENS": "3"} if odd else None))
    same("other_argument", case("other_argument", {"mixed": "allow"} if odd else plain))
    same("failing_profile", case("failing_profile", {"device": 99} if odd else plain))
    same("late", case("late", plain, sleep=T + 1.0 if odd else 0.0))
    v = case("recovered", plain)
    total = torch.tensor([rank + 1.0], device=dev)
    dist.all_reduce(total)
    print(f"rank {rank}  all_reduce after the faults: {float(total.item()):g} (expected {world * (world + 1) / 2:g})", flush=True)
    same("recovered", v)
    if args.json:
        Path(args.json).mkdir(parents=True, exist_ok=True)
    if odd:
        if args.json:
            Path(args.json, f"{rank}.json").write_text(json.dumps(doc, indent=2))
        sys.stdout.flush()
        os._exit(0)  # "dies": leaves the job before the last check
    case("dies", plain)
    if args.json:
        Path(args.json, f"{rank}.json").write_text(json.dumps(doc, indent=2))
    sys.stdout.flush()
    os._exit(0)  # a peer is gone: tearing the group down could wait on it


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--timeout", type=float, default=2.0, help="check_agreement's timeout in the fault cases (seconds)")
    p.add_argument("--json", help="a directory: each rank writes <rank>.json there")
    args = p.parse_args()
    if "RANK" not in os.environ:
        print("run it under torchrun: torchrun --standalone --nproc-per-node 2 benchmarks/nccl_agreement.py [--backend gloo]",
              file=sys.stderr)
        return 2

    import torch
    import torch.distributed as dist

    import hwprofile

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.backend == "nccl"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(args.backend, timeout=timedelta(seconds=120))
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    doc: dict[str, Any] = {"rank": rank, "world": world, "backend": args.backend}
    doc.update(torch=torch.__version__, hwprofile=hwprofile.__version__)

    cost(args, dev, rank, world, cuda, doc)
    faults(args, dev, rank, world, doc)


if __name__ == "__main__":
    sys.exit(main())
