"""Cost of hwprofile.distributed.check_agreement against one 32-byte all_gather (the design's yardstick).

    python benchmarks/bench_agreement.py --nproc 4 --backend gloo      # starts the ranks itself (one host)
    torchrun --nproc-per-node 2 benchmarks/bench_agreement.py --backend nccl   # or under torchrun

Per rank and iteration, round-robin so drift hits every variant alike, each timed on its own:
  allgather32   all_gather_single of a 32-byte uint8 tensor (NCCL: then a device synchronize)
  allgather128  the same with the 128-byte record check_agreement sends
  check         check_agreement() when every rank agrees (the profile already resolved)
  check_gather  check_agreement(gather=True): adds the gather of every rank's pickled summary (lengths, then one
                padded byte all_gather; hwprofile.distributed._collective._gather_bytes): the mismatch path
  gather_object all_gather_object of one summary alone
Rank 0 prints the medians (ms) and the ratio check / allgather32; --json writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import hwprofile
    from hwprofile import distributed as hd

    rank = int(os.environ["RANK"])
    cuda = args.backend == "nccl"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(args.backend)
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    world = dist.get_world_size()
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    bufs = {n: (torch.zeros(n, dtype=torch.uint8, device=dev), torch.empty(n * world, dtype=torch.uint8, device=dev)) for n in (32, 128)}

    def allgather(n: int) -> Callable[[], None]:
        def run() -> None:
            gather(bufs[n][1], bufs[n][0])
            if cuda:
                torch.cuda.synchronize()
        return run

    t0 = time.perf_counter()
    first = hd.check_agreement()
    first_s = time.perf_counter() - t0
    wire = hd.RankSummary.from_wire(first.ranks[rank].to_wire()).to_wire() if first.ranks else {}
    objs: list[object] = [None] * world

    variants: dict[str, Callable[[], object]] = {
        "allgather32": allgather(32),
        "allgather128": allgather(128),
        "check": lambda: hd.check_agreement(),
        "check_gather": lambda: hd.check_agreement(gather=True),
        "gather_object": lambda: dist.all_gather_object(objs, wire),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(args.warmup + args.iters):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    allmed: list[object] = [None] * world
    dist.all_gather_object(allmed, med)
    if rank == 0:
        worst = {k: max(m[k] for m in allmed) for k in med}  # type: ignore[index]
        doc = {
            "backend": args.backend, "world": world, "iters": args.iters, "torch": torch.__version__, "hwprofile": hwprofile.__version__,
            "first_check_ms": first_s * 1e3, "median_ms_rank0": med, "median_ms_worst_rank": worst,
            "ratio_check_to_allgather32": worst["check"] / worst["allgather32"],
        }
        print(f"{args.backend}, {world} ranks, {args.iters} iterations (median ms; worst rank)")
        for k in variants:
            print(f"  {k:<14} {worst[k]:8.3f}   (rank 0: {med[k]:.3f})")
        print(
            f"  check / allgather32 = {doc['ratio_check_to_allgather32']:.2f}x; first check_agreement in the process {first_s * 1e3:.1f} ms"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=2))
    dist.barrier()
    dist.destroy_process_group()


def launch(args: argparse.Namespace) -> int:
    """Start ``--nproc`` ranks of this script on this host (what torchrun would do)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    with tempfile.TemporaryDirectory():
        for r in range(args.nproc):
            env = dict(
                os.environ,
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE=str(args.nproc),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
            )
            procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env=env))
        return max(p.wait() for p in procs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--nproc", type=int, default=2, help="ranks to start when not run under torchrun")
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--json", help="rank 0 writes the results here")
    args = p.parse_args()
    if "RANK" in os.environ:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
