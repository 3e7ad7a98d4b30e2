"""The bring-up command, ``torchrun --nproc-per-node N -m hwprofile.distributed``; never torch or argparse at import.

:func:`main` is the whole command (``__main__`` only calls it, so that ``hwprofile.distributed.main``
exists without the package importing ``__main__``, which ``python -m`` would then run a second time).
It prints; the library functions it calls return.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final

from .._text import table
from ..errors import AgreementError, HwprofileError
from ._collective import check_agreement
from ._compare import _HEADER, MIXED_CHOICES, _row, _row_cells
from ._summary import _local_rank

_TORCHRUN_ENV: Final = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun --nproc-per-node N [--nnodes ...] -m hwprofile.distributed``: check a cluster before a job.

    Every rank resolves its own profile (its LOCAL_RANK's device) and joins one check; rank 0
    prints the per-rank table. Exit status: 0 agree, 1 disagree or a rank missing, 2 usage error or
    another hwprofile error (the rank prints it).
    """
    import argparse

    p = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m hwprofile.distributed",
        description="Check that every rank of a torchrun job resolves the same hwprofile profile.",
    )
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto", help="auto: nccl with a GPU per local rank, else gloo")
    p.add_argument("--mixed", choices=list(MIXED_CHOICES), default="error", help="allow: accept different GPU models that otherwise agree")
    p.add_argument("--timeout", type=_positive_seconds, default=120.0, help="seconds to wait for every rank (default 120)")
    p.add_argument("--json", action="store_true", help="rank 0 prints the result as JSON")
    args = p.parse_args(argv)

    missing_env = [v for v in _TORCHRUN_ENV if v not in os.environ]
    if missing_env:
        print(
            f"hwprofile.distributed: not started by torchrun ({', '.join(missing_env)} unset). Run it on every node as\n"
            "  torchrun --nproc-per-node N -m hwprofile.distributed                      (one host)\n"
            "  torchrun --nnodes M --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint HOST:PORT "
            "-m hwprofile.distributed   (each of M hosts)\n"
            "or call hwprofile.distributed.check_agreement() in the engine after init_process_group.",
            file=sys.stderr,
        )
        return 2
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    backend = args.backend
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if backend == "auto":
        # NCCL needs a GPU of its own per rank: with more ranks on this host than GPUs (a simulated
        # job on a one-GPU machine), it fails with "invalid usage"; gloo checks the same profiles
        backend = "nccl" if 0 < local_ranks <= gpus else "gloo"
    if backend == "nccl":
        if local_ranks > gpus:
            print(
                f"hwprofile.distributed: rank {rank}: error: --backend nccl needs one GPU per rank, but this host runs "
                f"{local_ranks} ranks and torch sees {gpus} GPU(s); use --backend gloo or fewer ranks per host",
                file=sys.stderr,
            )
            return 2
        torch.cuda.set_device(_local_rank() or 0)
    world = int(os.environ["WORLD_SIZE"])
    joined = _join(dist, backend, rank, world, args.timeout)
    if joined:
        print(f"hwprofile.distributed: rank {rank}: error: {joined}", file=sys.stderr)
        return 1
    together = True  # every rank reached the end of the check: they can leave together
    try:
        try:
            agreement = check_agreement(mixed=args.mixed, timeout=args.timeout, gather=True)
        except AgreementError as exc:
            together = bool(exc.ranks)  # the ranks exchanged their records (a difference, a refusal), not a timeout
            if rank == 0 or not exc.ranks:  # every rank knows the exchanged verdict; a missing rank is seen by each waiting one
                if args.json:
                    print(json_dumps({"agree": False, "error": str(exc), "ranks": [_row(r) for r in exc.ranks]}))
                else:
                    if exc.ranks:
                        print(table([_row_cells(r) for r in exc.ranks], _HEADER))
                    print(str(exc), file=sys.stderr)
            return 1
        except HwprofileError as exc:
            together = False
            print(f"hwprofile.distributed: rank {rank}: error: {exc}", file=sys.stderr)
            return 2
        if rank == 0:
            print(json_dumps(agreement.as_dict()) if args.json else agreement.table())
        return 0
    finally:
        sys.stdout.flush()
        if together:
            # A rank that tears gloo down while a peer is still using its connections can make the peer abort
            # ("terminate called without an active exception"): leave together.
            dist.barrier()
            dist.destroy_process_group()


def _positive_seconds(text: str) -> float:
    import argparse
    import math

    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (s > 0 and math.isfinite(s)):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive, finite number of seconds")
    return s


def _join(dist: Any, backend: str, rank: int, world: int, timeout_s: float) -> str:
    """Initialise the process group within ``timeout_s``; the reason it could not (empty: joined).

    A rank other than 0 first waits for rank 0's store to accept connections (torch's own client
    retries for several times the timeout, logging a C++ traceback per try); rank 0 waits for the
    others in torch's rendezvous, bounded by the same timeout.
    """
    import socket
    import time

    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    start = time.monotonic()
    if rank != 0:
        while True:
            try:
                with socket.create_connection((addr, port), timeout=max(0.1, min(1.0, timeout_s))):
                    break
            except OSError as exc:
                if time.monotonic() - start > timeout_s:
                    return (
                        f"nothing answered at MASTER_ADDR:MASTER_PORT ({addr}:{port}) within --timeout {timeout_s:g} s ({exc}): "
                        f"rank 0 of the {world} ranks is not running, or runs elsewhere. Start every rank (torchrun starts them all), "
                        "or raise --timeout."
                    )
                time.sleep(0.1)
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=max(0.1, timeout_s - (time.monotonic() - start))))
    except Exception as exc:  # noqa: BLE001 - a rank that never joined: torch's DistStoreError, DistNetworkError, gloo's RuntimeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"the {world} ranks of the job did not all join within --timeout {timeout_s:g} s "
            f"(waited {time.monotonic() - start:.1f} s; torch.distributed said: {first}). Start every rank (torchrun starts "
            "them all; by hand, each with its own RANK and the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT), or raise --timeout."
        )
    return ""


def json_dumps(doc: Any) -> str:
    import json

    return json.dumps(doc, indent=2, default=str)
